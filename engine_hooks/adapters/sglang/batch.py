"""What one SGLang batch allows, decided at its hooked logits call from SGLang 0.5.23's batch (SamplingBatchInfo
and ForwardBatch attributes; absent ones count as off).

- sharded: only batches whose greedy token is the argmax of the raw logits (`sharded_greedy_ok`); SGLang's
  sampler draws from torch's generator over the whole row, so no other batch can be sampled on the shards.
- gather: every batch but one that captures a sampling mask, which needs the full logits on every rank (such
  batches run all_gather in every mode). Ranks that skip SGLang's draws adopt rank 0's generator state before
  they draw again (gatherwise.engine_hooks.rng_resync).
- `engine.sampler: gatherwise`: the rows of the sampled batches gatherwise's sampler takes (sglang.sampled_rows).
"""

from __future__ import annotations

from typing import Any

from gatherwise.call_kind import call_kind, sampling_of_rows
from gatherwise.engine_hooks.adapters.batch_verdict import BatchVerdict
from gatherwise.engine_hooks.sampling_params import SamplingRow

NOT_RAW_ARGMAX = "a token that is not the argmax of the raw logits"
SAMPLING_MASK = "sampling-mask capture"


def full_logits_everywhere(forward_batch: Any) -> bool:
    """Whether every rank needs the batch's full logits: SGLang captures a sampling mask from them."""
    return getattr(forward_batch.sampling_info, "sampling_mask_batch_indices", None) is not None


def sglang_batch(forward_batch: Any, rows: list[SamplingRow] | None) -> BatchVerdict:
    """`forward_batch`: the batch of the hooked logits call; `rows`: gatherwise's sampler rows where it takes the
    batch."""
    kind = call_kind_of(forward_batch)
    if full_logits_everywhere(forward_batch):
        return BatchVerdict(kind, False, SAMPLING_MASK, SAMPLING_MASK)
    if rows is not None:
        return BatchVerdict(kind, False, None, None, rows)
    raw_argmax = sharded_greedy_ok(forward_batch)
    return BatchVerdict(kind, raw_argmax, None if raw_argmax else NOT_RAW_ARGMAX, None)


def call_kind_of(forward_batch: Any) -> int:
    """What the batch samples (gatherwise.call_kind), from SGLang's own per-batch flags."""
    info = forward_batch.sampling_info
    sampling = sampling_of_rows(bool(info.is_all_greedy), bool(getattr(info, "need_top_p_sampling", False)),
                                bool(getattr(info, "need_top_k_sampling", False)
                                     or getattr(info, "need_min_p_sampling", False)))
    return call_kind(sampling, bool(forward_batch.return_logprob))


def sharded_greedy_ok(forward_batch: Any) -> bool:
    """Whether SGLang's token for every row is the argmax of the raw logits, so sharded mode may pick it from
    the shards: an all-greedy batch with nothing that rewrites logits before the argmax (penalties, logit bias,
    grammar masks, custom logit processors, watermarks, sampling-mask capture) and no logprobs (they need every
    column). Attributes of SGLang 0.5.23's SamplingBatchInfo."""
    info = forward_batch.sampling_info
    if not info.is_all_greedy or forward_batch.return_logprob:
        return False
    penalizer = getattr(info, "penalizer_orchestrator", None)
    if penalizer is not None and penalizer.is_required:
        return False
    rewrites = ("logit_bias", "grammars", "acc_additive_penalties", "acc_scaling_penalties",
                "sampling_mask_batch_indices")
    if any(getattr(info, name, None) is not None for name in rewrites):
        return False
    return not (getattr(info, "has_custom_logit_processor", False) or getattr(info, "has_watermark_candidates", False))
