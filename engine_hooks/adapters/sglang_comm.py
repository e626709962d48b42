"""SGLang's tensor-parallel GroupCoordinator as an engine_hooks Communicator.

The all_gather takes the route SGLang's own `GroupCoordinator.all_gather_into_tensor` takes: on CUDA its
registered custom op (pynccl or NCCL through torch.distributed, opaque to torch.compile and capturable in a
CUDA graph), on CPU torch.distributed on the device group (gloo). The rooted gather is the one SGLang's
`GroupCoordinator.gather` makes (torch.distributed.gather on the device group), but into the logits path's
buffers instead of freshly allocated ones; the broadcast is `GroupCoordinator.broadcast` (pynccl when enabled).
"""

from __future__ import annotations

import torch

from engine_hooks.adapters.group_coordinator_comm import GroupCoordinatorCommunicator


class SglangGroupCommunicator(GroupCoordinatorCommunicator):
    """Communicator over an SGLang GroupCoordinator (duck-typed: rank_in_group, world_size, ranks,
    device_group, all_gather_into_tensor, broadcast). All collectives are rooted at group rank 0."""

    def _all_gather_flat(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        self.group.all_gather_into_tensor(out, inp)
