"""Model Runner V2's keyed sampling on one vocab shard: this rank's winner of each row, with V2's own code.

V2 samples a row as the argmax over its columns of `processed logit + noise(seed, position, token id)`
(`vllm.v1.worker.gpu.sample.gumbel`); the noise of a column is a hash of its own id, and for the batches
gatherwise shards (vllm.v2_batch) every step before it acts on each column by
itself. So the rank builds the row V2 would see with only its own columns filled (-inf elsewhere: -inf stays
-inf through every such step and never wins), runs V2's `Sampler.apply_sampling_params` on it — the very
functions plain V2 runs, so the shard's columns get the same values bit for bit, on any backend — and then V2's
own Gumbel kernel, `_gumbel_sample_kernel`, launched here instead of through `gumbel_sample` only because that
function returns the winner's id but not its value, which the ranks must compare. The kernel writes each
1024-column block's best (value, id); this rank's winner is the best block, the first on ties, as in
`gumbel_sample`. Across ranks the largest value wins and the lowest id on ties
(gatherwise.engine_hooks.sharded_exchange.ShardedSampler.exchange_winners): the full row's first argmax, which
is what plain V2 samples.

Only columns below the shard's end are launched (the kernel's keys are the column ids from 0, so the launch
starts at column 0 and the columns before the shard cost hashes of -inf): the last rank's kernel covers the row
and the others less. What sharding saves is the exchange: the [B, vocab] logits all_gather becomes B (value,
id) pairs per rank.
"""

from __future__ import annotations

from typing import Any

import torch

BLOCK_SIZE = 1024  # V2's gumbel_sample launches blocks of this many columns
KERNEL = ("vllm.v1.worker.gpu.sample.gumbel", "_gumbel_sample_kernel")
_DRAFT_CACHE = ("logits_cache_ptr", "logits_cache_stride_0", "logits_cache_stride_1", "logits_cache_col_ptr",
                "logits_cache_source_ptr", "logits_cache_source_stride")
# The kernel's parameters in each release the adapter was verified against (the fingerprint of
# `_gumbel_sample_kernel` says which): 0.32 and 0.33, then 0.34, which adds a row mapping for the draft logits
# cache and an additive bias.
KERNEL_SIGNATURES = (
    ("local_argmax_ptr", "local_argmax_stride", "local_max_ptr", "local_max_stride", *_DRAFT_CACHE, "logits_ptr",
     "logits_stride", "expanded_idx_mapping_ptr", "seeds_ptr", "pos_ptr", "temp_ptr", "vocab_size", "BLOCK_SIZE",
     "IS_DRAFTING", "APPLY_TEMPERATURE", "USE_FP64", "PER_TOKEN_COL"),
    ("local_argmax_ptr", "local_argmax_stride", "local_max_ptr", "local_max_stride", *_DRAFT_CACHE,
     "logits_cache_row_mapping_ptr", "logits_ptr", "logits_stride", "bias_ptr", "bias_stride",
     "expanded_idx_mapping_ptr", "seeds_ptr", "pos_ptr", "temp_ptr", "vocab_size", "BLOCK_SIZE", "IS_DRAFTING",
     "APPLY_TEMPERATURE", "USE_FP64", "PER_TOKEN_COL", "HAS_BIAS"),
)
# What a launch on a shard passes for the arguments that are not the shard's own: no draft logits cache, no bias,
# and V2's Sampler._sample_random's settings (the temperature is applied before, by apply_sampling_params).
FIXED_ARGS: dict[str, object] = {
    "logits_cache_ptr": None, "logits_cache_stride_0": 0, "logits_cache_stride_1": 0, "logits_cache_col_ptr": None,
    "logits_cache_source_ptr": None, "logits_cache_source_stride": 0, "logits_cache_row_mapping_ptr": None,
    "bias_ptr": None, "bias_stride": 0, "BLOCK_SIZE": BLOCK_SIZE, "IS_DRAFTING": False, "APPLY_TEMPERATURE": False,
    "PER_TOKEN_COL": False, "HAS_BIAS": False}


def kernel_problem() -> str | None:
    """Why V2's Gumbel kernel is not one this module launches (None: it is)."""
    import importlib

    kernel = getattr(importlib.import_module(KERNEL[0]), KERNEL[1], None)
    names = tuple(getattr(kernel, "arg_names", ()))
    if names not in KERNEL_SIGNATURES:
        return f"{'.'.join(KERNEL)} takes {names or 'unknown arguments'}, not the arguments this adapter launches"
    return None


def launch_args(names: tuple[str, ...], shard_args: dict[str, object]) -> tuple[list[object], dict[str, object]]:
    """The kernel's arguments in the order of its parameters `names`: (positional, constexpr keywords), as V2's
    gumbel_sample passes them; `shard_args` are the shard's own (buffers, strides, sizes)."""
    values = {**FIXED_ARGS, **shard_args}
    return ([values[n] for n in names if not n.isupper()], {n: values[n] for n in names if n.isupper()})


class KeyedShard:
    """One rank's reusable full-width row buffer."""

    def __init__(self) -> None:
        self._rows = torch.empty(0)

    def winners(self, sampler: Any, shard: torch.Tensor, first: int, vocab: int, batch: tuple[Any, ...]
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """This shard's winner of every row: (values [B], global ids [B]).

        `shard`: [B, width] logits of columns `first`... (padding past the vocab at -inf); `vocab`: the width of
        the logits V2's sampler gets; `batch`: the arguments V2's `Sampler.sample` got after the logits
        (expanded_idx_mapping, idx_mapping, idx_mapping_np, pos, input_ids, expanded_local_pos,
        seq_lens_upper_bound_np).
        """
        from vllm.v1.worker.gpu.sample.gumbel import _gumbel_sample_kernel

        rows = shard.shape[0]
        end = min(vocab, first + shard.shape[1])
        full = self._full(rows, vocab, shard)
        full[:, :first] = float("-inf")
        full[:, first:end] = shard[:, : end - first]
        full[:, end:] = float("-inf")
        expanded_idx_mapping, pos = batch[0], batch[3]
        processed = sampler.apply_sampling_params(full, *batch, skip_top_k_top_p=True)
        launched = processed[:, :end]
        states = sampler.sampling_states
        blocks = -(-end // BLOCK_SIZE)
        local_ids = launched.new_empty(rows, blocks, dtype=torch.int64)
        local_max = launched.new_empty(rows, blocks, dtype=torch.float64 if sampler.use_fp64_gumbel else torch.float32)
        args, constexprs = launch_args(tuple(_gumbel_sample_kernel.arg_names), {
            "local_argmax_ptr": local_ids, "local_argmax_stride": local_ids.stride(0), "local_max_ptr": local_max,
            "local_max_stride": local_max.stride(0), "logits_ptr": launched, "logits_stride": launched.stride(0),
            "expanded_idx_mapping_ptr": expanded_idx_mapping.contiguous(), "seeds_ptr": states.seeds.gpu,
            "pos_ptr": pos.contiguous(), "temp_ptr": states.temperature.gpu, "vocab_size": end,
            "USE_FP64": sampler.use_fp64_gumbel})
        _gumbel_sample_kernel[(rows, blocks)](*args, **constexprs)
        best = local_max.argmax(dim=-1, keepdim=True)
        return local_max.gather(-1, best).view(-1), local_ids.gather(-1, best).view(-1)

    def _full(self, rows: int, vocab: int, shard: torch.Tensor) -> torch.Tensor:
        b = self._rows
        if b.shape[0] < rows or b.shape[1:] != (vocab,) or b.dtype != shard.dtype or b.device != shard.device:
            self._rows = b = torch.empty(max(rows, 2 * b.shape[0]), vocab, dtype=shard.dtype, device=shard.device)
        return b[:rows]
