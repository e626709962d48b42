"""A Communicator wrapper that counts the collectives the logits path really issues, for the multi-rank token
tests (a model's own all_reduces bypass it: they go through torch.distributed directly)."""

from __future__ import annotations

import torch

from gatherwise.engine_hooks.comm import Communicator


class CountingComm:
    def __init__(self, inner: Communicator) -> None:
        self.inner, self.rank, self.world_size, self.count = inner, inner.rank, inner.world_size, 0

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        self.count += 1
        self.inner.all_gather(out, inp)

    def gather(self, out: torch.Tensor | None, inp: torch.Tensor) -> None:
        self.count += 1
        self.inner.gather(out, inp)

    def broadcast(self, tensor: torch.Tensor) -> None:
        self.count += 1
        self.inner.broadcast(tensor)
