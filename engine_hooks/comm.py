"""The three collectives the logits path needs, behind a small interface.

Engines bring their own group implementation (vLLM's GroupCoordinator, SGLang's pynccl); the reference
engine uses `TorchDistCommunicator` over a torch.distributed process group (gloo on CPU, NCCL on CUDA).
All collectives are rooted at TP rank 0.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.distributed as dist


class Communicator(Protocol):
    rank: int
    world_size: int

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        """out[r] <- inp of rank r, on every rank. `out` is [world_size, *inp.shape], contiguous."""

    def gather(self, out: torch.Tensor | None, inp: torch.Tensor) -> None:
        """On rank 0, out[r] <- inp of rank r; `out` is None on other ranks."""

    def broadcast(self, tensor: torch.Tensor) -> None:
        """tensor <- rank 0's tensor, in place, on every rank."""


_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in 2.13


class TorchDistCommunicator:
    """Communicator over a torch.distributed group; ranks are group ranks, the root is group rank 0."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self._root = dist.get_global_rank(group, 0) if group is not None else 0

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        # gloo wants the output shaped (world * d0, ...): hand it the flat view of the same storage
        _all_gather_single(out.view(-1), inp.view(-1), group=self.group)

    def gather(self, out: torch.Tensor | None, inp: torch.Tensor) -> None:
        gather_list = list(out.unbind(0)) if out is not None else None
        dist.gather(inp, gather_list, dst=self._root, group=self.group)

    def broadcast(self, tensor: torch.Tensor) -> None:
        dist.broadcast(tensor, src=self._root, group=self.group)


class SingleRankCommunicator:
    """TP=1: every collective is a local copy (or nothing), so P=1 runs the same code path."""

    rank = 0
    world_size = 1

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        out[0].copy_(inp)

    def gather(self, out: torch.Tensor | None, inp: torch.Tensor) -> None:
        assert out is not None
        out[0].copy_(inp)

    def broadcast(self, tensor: torch.Tensor) -> None:
        pass


def default_communicator(group: dist.ProcessGroup | None = None) -> Communicator:
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return SingleRankCommunicator()
    return TorchDistCommunicator(group)
