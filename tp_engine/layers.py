"""Megatron-style tensor-parallel building blocks: who holds which slice, and the parallel ops.

- vocab-parallel embedding: rank r holds vocab rows [r*width, r*width+width) (width = the logits path's
  shard width, so the embedding and the LM head shard the vocabulary exactly like the logits buffer);
  lookups outside the slice give zeros and one all_reduce sums them (exact: one rank contributes, the rest 0);
- column-parallel linear (QKV, gate/up): each rank holds a slice of the output features, no communication;
- row-parallel linear (O, down): each rank holds a slice of the input features, partial sums all_reduced.
Heads and MLP features are split in contiguous, as-even-as-possible slices, so P need not divide them
(e.g. 4 heads on P=3). A rank holds every KV head its query heads use (KV heads are replicated when needed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from gatherwise.engine_hooks.logits_path import shard_width
from gatherwise.tp_engine.config import ModelConfig


@dataclass(frozen=True)
class Span:
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def split_evenly(total: int, parts: int, index: int) -> Span:
    """The index-th of `parts` contiguous slices of range(total); the first total % parts get one more."""
    base, extra = divmod(total, parts)
    start = index * base + min(index, extra)
    return Span(start, start + base + (1 if index < extra else 0))


def vocab_span(vocab: int, rank: int, world_size: int) -> Span:
    """Vocab rows of this rank; may run past `vocab` on the last ranks (zero padding, masked by the path)."""
    width = shard_width(vocab, world_size)
    return Span(rank * width, rank * width + width)


@dataclass(frozen=True)
class HeadShard:
    q: Span  # query heads of this rank
    kv: Span  # KV heads this rank holds
    kv_of_q: tuple[int, ...]  # for each local query head, the index of its KV head among the local ones


def head_shard(config: ModelConfig, rank: int, world_size: int) -> HeadShard:
    if world_size > config.num_heads:
        raise ValueError(f"tensor parallel size {world_size} exceeds the number of attention heads "
                         f"({config.num_heads})")
    q = split_evenly(config.num_heads, world_size, rank)
    group = config.group_size
    kv = Span(q.start // group, (q.stop - 1) // group + 1)
    return HeadShard(q, kv, tuple(h // group - kv.start for h in range(q.start, q.stop)))


class TPGroup:
    """The tensor-parallel process group as the model sees it: an all_reduce that is a no-op at P=1."""

    def __init__(self, rank: int = 0, world_size: int = 1, group: dist.ProcessGroup | None = None) -> None:
        self.rank, self.world_size, self.group = rank, world_size, group

    @classmethod
    def from_dist(cls, group: dist.ProcessGroup | None = None) -> TPGroup:
        if not dist.is_initialized():
            return cls()
        return cls(dist.get_rank(group), dist.get_world_size(group), group)

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            dist.all_reduce(tensor, group=self.group)
        return tensor


def vocab_parallel_embedding(ids: torch.Tensor, weight: torch.Tensor, vocab_start: int, tp: TPGroup) -> torch.Tensor:
    local = ids - vocab_start
    inside = (local >= 0) & (local < weight.shape[0])
    out = F.embedding(local.clamp(0, weight.shape[0] - 1), weight)
    out = out * inside.unsqueeze(-1).to(out.dtype)
    return tp.all_reduce(out)


def column_parallel(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(x, weight, bias)


def row_parallel(x: torch.Tensor, weight: torch.Tensor, tp: TPGroup, bias: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """Partial sums all_reduced; the (whole) bias is added after the sum, so it counts once, not P times."""
    out = tp.all_reduce(F.linear(x, weight))
    return out if bias is None else out + bias


def lm_head_into(hidden: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> None:
    """This rank's logits shard straight into `out` (the logits path's send buffer), rounded to its dtype."""
    if out.dtype == hidden.dtype:
        torch.matmul(hidden, weight.T, out=out)
    else:
        out.copy_(hidden @ weight.T)  # compute dtype -> logits dtype: the rounding copy is the conversion itself
