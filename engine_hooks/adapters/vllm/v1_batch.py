"""What one V1 batch allows, decided at its logits call from vLLM's SamplingMetadata (vLLM 0.32's V1 runner).

- sharded: only batches whose greedy token is the argmax of the raw logits (`sharded_greedy_ok`,
  `raw_argmax_is_kept`: no soft cap or logit scale, which vLLM applies after the gather) and that hold no
  structured-output request (the grammar bitmask is applied after the collective, to the full logits). V1's
  sampler draws from torch generators over the whole row, so no other batch can be sampled on the shards.
- gather: where skipping the sampler could leave a rank's state behind rank 0's (the thinking-budget state,
  which vLLM's sampler updates; logits processors other than vLLM's built-ins, which may keep state), the batch
  runs all_gather (`gather_ok`).
- `engine.sampler: gatherwise`: the rows of the sampled batches gatherwise's sampler takes
  (vllm.v1_sampler_rows).
"""

from __future__ import annotations

from typing import Any

from gatherwise.call_kind import call_kind, sampling_of_rows
from gatherwise.engine_hooks.adapters.batch_verdict import BatchVerdict
from gatherwise.engine_hooks.adapters.vllm.v1_sampler_rows import builtin_is_idle, is_builtin
from gatherwise.engine_hooks.sampling_params import SamplingRow, kind_of_rows

NOT_RAW_ARGMAX = "a token that is not the argmax of the raw logits"
SAMPLER_STATE = "sampler state that only the ranks that sample would keep"


def v1_batch(metadata: Any, processor: Any, structured: bool, rows: list[SamplingRow] | None) -> BatchVerdict:
    """`metadata`: the batch's SamplingMetadata; `processor`: vLLM's LogitsProcessor layer; `structured`: the
    step has structured-output requests; `rows`: gatherwise's sampler rows where it takes the batch."""
    if rows is not None:
        return BatchVerdict(kind_of_rows(rows), False, None, None, rows)
    raw_argmax = not structured and raw_argmax_is_kept(processor) and sharded_greedy_ok(metadata)
    return BatchVerdict(call_kind_of(metadata), raw_argmax, None if raw_argmax else NOT_RAW_ARGMAX,
                        None if gather_ok(metadata) else SAMPLER_STATE)


def raw_argmax_is_kept(processor: Any) -> bool:
    """Whether vLLM's LogitsProcessor leaves the gathered logits as they are: its soft cap (tanh) and scale come
    after the gather, and rounding can turn two different logits into a tie there, which moves the argmax."""
    return getattr(processor, "soft_cap", None) is None and getattr(processor, "scale", 1.0) == 1.0


def gather_ok(metadata: Any) -> bool:
    """Whether rank 0 alone may run vLLM's sampler while the other ranks skip it: nothing in the sampler keeps
    state the skipping ranks would then lack. vLLM's thinking-budget state is updated inside the sampler, and a
    logits processor that is not one of vLLM's built-ins (whose apply() keeps no state) may keep state."""
    holder = getattr(metadata, "thinking_budget_state_holder", None)
    if holder is not None and holder.has_tracked_requests():
        return False
    procs = metadata.logitsprocs
    return all(is_builtin(p) for group in (procs.argmax_invariant, procs.non_argmax_invariant) for p in group)


def call_kind_of(metadata: Any) -> int:
    """What the batch samples (gatherwise.call_kind), from vLLM's SamplingMetadata (top_p/top_k are None when no
    request of the batch uses them)."""
    sampling = sampling_of_rows(bool(metadata.all_greedy), metadata.top_p is not None,
                                metadata.top_k is not None or getattr(metadata, "min_p", None) is not None)
    return call_kind(sampling, metadata.max_num_logprobs is not None)


def sharded_greedy_ok(metadata: Any) -> bool:
    """Whether vLLM's greedy token for every row is the argmax of the raw logits, so sharded mode may pick it
    from the shards: nothing that rewrites logits before the argmax, and no logprobs (they need every column).
    Unknown logits processors that may move the argmax make it False."""
    if not metadata.all_greedy or not metadata.no_penalties or metadata.allowed_token_ids_mask is not None:
        return False
    if metadata.bad_words_token_ids or metadata.max_num_logprobs is not None:
        return False
    if getattr(metadata, "logprob_token_ids", None) or any(getattr(metadata, "spec_token_ids", None) or ()):
        return False  # spec_token_ids is one (normally empty) list per request slot
    holder = getattr(metadata, "thinking_budget_state_holder", None)
    if holder is not None and holder.has_tracked_requests():
        return False
    return all(builtin_is_idle(proc) for proc in getattr(metadata.logitsprocs, "non_argmax_invariant", ()))
