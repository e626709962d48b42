"""SGLang's tensor-parallel GroupCoordinator as an engine_hooks Communicator.

The all_gather takes the route SGLang's own logits all_gather (`GroupCoordinator.all_gather`) takes: on CUDA its
registered custom op (pynccl or NCCL through torch.distributed, opaque to torch.compile and capturable in a
CUDA graph); on a CPU host where SGLang uses its shared-memory kernel (`sgl_kernel.shm_allgather`: AMX or arm64
hosts, every rank on one node) that kernel, else torch.distributed on the device group (gloo). SGLang's
`all_gather_into_tensor`, which takes a preallocated output, never uses the kernel on CPU, so calling it there
would put gloo under a path SGLang itself runs in shared memory. The kernel returns a fresh tensor, copied into
the logits path's buffer; it takes floating point only, so other payloads travel as float32 views of their bytes
(engine_hooks.adapters.float_views), and the broadcast is an all_gather there too (the kernel has no broadcast).
The rooted gather is the one SGLang's `GroupCoordinator.gather` makes (torch.distributed.gather on the device
group), into the logits path's buffers; elsewhere the broadcast is `GroupCoordinator.broadcast`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gatherwise.engine_hooks.adapters.float_views import float_view
from gatherwise.engine_hooks.adapters.group_coordinator_comm import GroupCoordinatorCommunicator

ShmAllGather = Callable[[torch.Tensor, int], torch.Tensor]


def sglang_cpu_shm_allgather(group: Any) -> ShmAllGather | None:
    """SGLang's CPU shared-memory all_gather where SGLang itself would use it for float32 logits, else None."""
    try:
        from sglang.srt.utils.common import is_shm_available
    except ImportError:
        return None
    if not is_shm_available(torch.float32, group.world_size, getattr(group, "local_size", 0)):
        return None
    return torch.ops.sgl_kernel.shm_allgather


class SglangGroupCommunicator(GroupCoordinatorCommunicator):
    """Communicator over an SGLang GroupCoordinator (duck-typed: rank_in_group, world_size, ranks,
    device_group, all_gather_into_tensor, broadcast). All collectives are rooted at group rank 0. `shm_allgather`:
    the CPU shared-memory all_gather to use (default: SGLang's, where SGLang uses it)."""

    def __init__(self, group: Any, shm_allgather: ShmAllGather | None = None) -> None:
        super().__init__(group)
        self._shm = shm_allgather if shm_allgather is not None else sglang_cpu_shm_allgather(group)
        self.transport = "sgl_kernel.shm_allgather" if self._shm is not None else "GroupCoordinator"

    def _all_gather_flat(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        if self._shm is not None and inp.is_cpu:
            views = float_view(out), float_view(inp)
            if views[0] is not None and views[1] is not None:  # the same shapes on every rank: the same branch
                views[0].copy_(self._shm(views[1], 0))
                return
        self.group.all_gather_into_tensor(out, inp)

    def broadcast(self, tensor: torch.Tensor) -> None:
        shm = self._shm
        flat = float_view(tensor) if shm is not None and tensor.is_cpu else None
        if shm is None or flat is None:
            return super().broadcast(tensor)
        gathered = shm(flat, 0)
        if self.rank != 0:
            flat.copy_(gathered[: flat.numel()])
