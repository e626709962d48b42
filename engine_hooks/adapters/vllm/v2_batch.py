"""What one Model Runner V2 batch allows, decided at its logits call from V2's sampler state (vLLM 0.32).

V2's `Sampler.sample` turns the gathered logits into tokens in this order: the logits processors (logit bias with
allowed token ids and min-tokens, penalties, bad words, any custom ones) and the thinking budget, each only for
the requests that flagged it at `add_request`; temperature; min-p; top-k / top-p (`apply_top_k_top_p`, a
whole-row sort); then `gumbel_sample`, an argmax over the row of `logit + noise`, where a token's noise is a
hash of (request seed, position, token id) and nothing else (greedy rows: no noise). Before it `runner.sample`
applies the grammar bitmask of structured-output requests to the full logits; after it `Sampler.__call__` takes
logprobs from the full logits and may build a sampling mask from them.

- sharded, exact: every step up to the noise acts on each column by itself (the native processors read a
  column's own counts, bias, ban; temperature divides it), so a rank that runs V2's own functions on a
  full-width row holding only its shard (-inf elsewhere) gets, on its columns, the values V2 computes on the
  full row, bit for bit, and the full row's winner is the best of the shards' winners
  (vllm.v2_keyed). What needs the whole row steps aside to all_gather: min-p,
  top-k, top-p, logprobs, the sampling mask, the NaN count, a custom logits processor (it may look across the
  row), the thinking budget (it forces tokens over the whole row), the grammar bitmask, the LM head's soft cap
  or scale (applied after the gather, to the logits gatherwise hands on), and any sampler other than V2's own
  `Sampler` (the watermarking sampler, a model's custom sampler).
- gather: rank 0 runs V2's sampler on the full logits and the tokens reach every rank by one broadcast; the
  other ranks skip `Sampler.sample`, so it must leave no state behind on them: the thinking budget updates its
  scan caches there, and a custom processor or another sampler may keep state, so those batches run
  all_gather. V2's own draw is keyed, so no random state needs resynchronising (unlike V1) — except where a
  GPU build samples top-k/top-p batches with FlashInfer's or XPU's fused sampler, which draws from a device
  generator: those batches run all_gather too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gatherwise.call_kind import call_kind, sampling_of_rows
from gatherwise.engine_hooks.adapters.batch_verdict import BatchVerdict

_NATIVE_PROCESSORS = frozenset({"LogitBiasState", "PenaltiesState", "BadWordsState"})
_NATIVE_MODULE = "vllm.v1.worker.gpu.sample."
_V2_SAMPLER = ("vllm.v1.worker.gpu.sample.sampler", "Sampler")


def _custom_processors(sampler: Any) -> bool:
    return any(type(p).__name__ not in _NATIVE_PROCESSORS or not type(p).__module__.startswith(_NATIVE_MODULE)
               for p in sampler.logits_processors)


def v2_batch(sampler: Any, input_batch: Any, processor: Any, structured: bool, rows: int) -> BatchVerdict:
    """`sampler`: the runner's V2 Sampler; `input_batch`: the step's V2 InputBatch; `processor`: vLLM's
    LogitsProcessor layer; `structured`: the step carries a grammar bitmask; `rows`: the logits rows."""
    idx = input_batch.idx_mapping_np
    states = sampler.sampling_states
    temperature = states.temperature.np[idx]
    all_greedy = bool(np.all(temperature == 0.0))
    top_p = bool(np.any(states.top_p.np[idx] != 1.0))
    top_k = bool(np.any(states.top_k.np[idx] != states.vocab_size))
    min_p = bool(np.any(states.min_p.np[idx] != 0.0))
    logprobs = sampler.get_logprobs_dims(idx) is not None
    processing = bool(np.any(sampler.needs_logits_processing[idx]))
    custom = processing and _custom_processors(sampler)
    own_sampler = (type(sampler).__module__, type(sampler).__name__) == _V2_SAMPLER
    budget = sampler.thinking_budget_state
    thinking = bool(budget.enabled and np.any(budget.use_thinking_budget[idx]))
    kind = call_kind(sampling_of_rows(all_greedy, top_p, top_k or min_p), logprobs)

    sharded_reason = None
    if not own_sampler:
        sharded_reason = "a sampler other than V2's own (watermarking, a model's custom sampler)"
    elif structured:
        sharded_reason = "structured outputs"
    elif getattr(processor, "soft_cap", None) is not None or getattr(processor, "scale", 1.0) != 1.0:
        sharded_reason = "logit soft cap or scale"
    elif top_k or top_p or min_p:
        sharded_reason = "top-k, top-p or min-p"
    elif logprobs:
        sharded_reason = "logprobs"
    elif custom:
        sharded_reason = "custom logits processor"
    elif thinking:
        sharded_reason = "thinking budget"
    elif sampler.return_sampling_mask or sampler.compute_nans:
        sharded_reason = "sampling mask or NaN count"
    elif rows != len(idx):
        sharded_reason = "logits rows that are not one per request"
    # FlashInfer's and XPU's fused top-k/top-p samplers draw from a device generator, which a skipping rank
    # would leave behind rank 0's (conservatively: any top-k/top-p batch where one is in use)
    fused = bool(getattr(sampler, "use_flashinfer", False) or getattr(sampler, "use_xpu_sampler", False))
    gather_reason = ("thinking budget" if thinking else "custom logits processor" if custom else
                     "a fused top-k/top-p sampler (FlashInfer, XPU) drawing from a device generator"
                     if fused and (top_k or top_p) else
                     None if own_sampler else sharded_reason)  # another sampler may keep state
    return BatchVerdict(kind, all_greedy and not processing and sharded_reason is None, sharded_reason, gather_reason)
