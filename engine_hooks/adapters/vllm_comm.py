"""vLLM's tensor-parallel GroupCoordinator as an engine_hooks Communicator.

The logits collectives go through the same transport vLLM uses for its own logits all_gather: on CPU that is
the device communicator's shared-memory ops (`torch.ops._C.shm_all_gather` / `shm_gather`, reached through
`CpuCommunicator.dist_module`), elsewhere torch.distributed on the group's device group (NCCL on CUDA). They
write straight into the logits path's preallocated buffers, so nothing is copied after the collective.

vLLM's shared-memory ops take floating-point tensors only; the int64 tensors of the one-time handshake and the
token broadcast go through torch.distributed on the device group (gloo on CPU), as GroupCoordinator.broadcast
does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from engine_hooks.adapters.group_coordinator_comm import GroupCoordinatorCommunicator
from engine_hooks.torch_dtypes import TORCH_LOGITS_DTYPES

_SHM_DTYPES = frozenset(TORCH_LOGITS_DTYPES.values())  # the logits; vLLM's shm ops take floating point only



class VllmGroupCommunicator(GroupCoordinatorCommunicator):
    """Communicator over a vLLM GroupCoordinator (duck-typed: rank_in_group, world_size, ranks, device_group,
    device_communicator, broadcast). All collectives are rooted at group rank 0."""

    def __init__(self, group: Any) -> None:
        super().__init__(group)
        # CpuCommunicator keeps its transport in `dist_module`: vLLM's shared-memory ops, or torch.distributed
        # when those are unavailable. Both take torch.distributed's argument conventions.
        self._fast = getattr(group.device_communicator, "dist_module", None) or dist

    def _gather_transport(self, t: torch.Tensor):
        return self._fast if t.dtype in _SHM_DTYPES else dist

    def _all_gather_flat(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        self._gather_transport(inp).all_gather_into_tensor(out, inp, group=self._device_group)
