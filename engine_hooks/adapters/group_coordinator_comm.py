"""An engine's tensor-parallel GroupCoordinator as an engine_hooks Communicator.

vLLM and SGLang share the shape of their TP group object (SGLang's parallel_state descends from vLLM's):
`rank_in_group`, `world_size`, `ranks` (global ranks, group rank 0 first), `device_group` (the
torch.distributed group on the logits' device) and `broadcast(tensor, src)`. What differs per engine is only
the transport the all_gather takes, so each adapter subclasses this and supplies `_all_gather_flat`.

All collectives are rooted at group rank 0 and write straight into the logits path's preallocated buffers.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


class GroupCoordinatorCommunicator:
    """Communicator over a GroupCoordinator. Subclasses choose the all_gather transport."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.rank = int(group.rank_in_group)
        self.world_size = int(group.world_size)
        self._root = group.ranks[0]  # global rank of group rank 0
        self._device_group = group.device_group

    def _all_gather_flat(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        """out (world_size * n,) <- every rank's inp (n,), in rank order."""
        dist.all_gather_into_tensor(out, inp, group=self._device_group)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        self._all_gather_flat(out.view(-1), inp.view(-1))

    def gather(self, out: torch.Tensor | None, inp: torch.Tensor) -> None:
        gather_list = list(out.unbind(0)) if out is not None else None
        dist.gather(inp, gather_list, dst=self._root, group=self._device_group)

    def broadcast(self, tensor: torch.Tensor) -> None:
        self.group.broadcast(tensor, src=0)
