"""vLLM's tensor-parallel GroupCoordinator as an engine_hooks Communicator.

Every collective gatherwise adds goes through the transport vLLM uses for its own logits all_gather: on CPU
the device communicator's shared-memory ops (`torch.ops._C.shm_all_gather` / `shm_gather`, reached through
`CpuCommunicator.dist_module`) when vLLM could set them up, else torch.distributed on the group's device group
(gloo on CPU, NCCL on CUDA). They write straight into the logits path's preallocated buffers.

The shared-memory ops take floating-point tensors and have no broadcast. They copy bytes, so the other tensors
(the sharded exchange's float64 (max, index) pairs, int64 token ids and control words, the handshake) travel as
float32 views of the same bytes — exact for every bit pattern, NaN payloads included — and a broadcast is an
all_gather whose rank-0 slot every rank keeps: one shared-memory copy instead of a blocking gloo round trip. A
tensor with no such view (a byte count that is no multiple of 4) takes torch.distributed; shapes are
the same on every rank, so every rank takes the same branch.
Where vLLM's shared-memory ops are not set up, `dist_module` is torch.distributed and nothing is re-viewed.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from gatherwise.engine_hooks.adapters.float_views import float_view
from gatherwise.engine_hooks.adapters.group_coordinator_comm import GroupCoordinatorCommunicator


class VllmGroupCommunicator(GroupCoordinatorCommunicator):
    """Communicator over a vLLM GroupCoordinator (duck-typed: rank_in_group, world_size, ranks, device_group,
    device_communicator, broadcast). All collectives are rooted at group rank 0."""

    def __init__(self, group: Any) -> None:
        super().__init__(group)
        # CpuCommunicator keeps its transport in `dist_module`: vLLM's shared-memory ops, or torch.distributed
        # when those are unavailable. Both take torch.distributed's argument conventions.
        self._fast = getattr(group.device_communicator, "dist_module", None) or dist
        self.transport = "torch.distributed" if self._fast is dist else type(self._fast).__name__
        self._bcast_scratch: torch.Tensor | None = None

    def _all_gather_flat(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        fast_out, fast_inp = (None, None) if self._fast is dist else (float_view(out), float_view(inp))
        if fast_out is None or fast_inp is None:  # the same shape on every rank: every rank takes this branch
            dist.all_gather_into_tensor(out, inp, group=self._device_group)
        else:
            self._fast.all_gather_into_tensor(fast_out, fast_inp, group=self._device_group)

    def gather(self, out: torch.Tensor | None, inp: torch.Tensor) -> None:
        fast_inp = None if self._fast is dist else float_view(inp)
        if fast_inp is None:
            return dist.gather(inp, list(out.unbind(0)) if out is not None else None, dst=self._root,
                               group=self._device_group)
        gather_list = None
        if out is not None:
            fast_out = float_view(out)  # out has inp's dtype: it has a float view unless it is not contiguous
            if fast_out is None:
                raise ValueError("gather(): out must be contiguous to take the transport's float32 view")
            gather_list = list(fast_out.view(self.world_size, -1).unbind(0))
        self._fast.gather(fast_inp, gather_list, dst=self._root, group=self._device_group)

    def broadcast(self, tensor: torch.Tensor) -> None:
        flat = None if self._fast is dist else float_view(tensor)
        if flat is None:
            return super().broadcast(tensor)
        n = flat.numel()
        scratch = self._bcast_scratch
        if scratch is None or scratch.numel() < self.world_size * n or scratch.device != flat.device:
            scratch = self._bcast_scratch = torch.empty(self.world_size * max(n, 64), dtype=torch.float32,
                                                        device=flat.device)
        out = scratch[: self.world_size * n]
        self._fast.all_gather_into_tensor(out, flat, group=self._device_group)
        if self.rank != 0:
            flat.copy_(out[:n])
