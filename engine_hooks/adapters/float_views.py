"""Byte-exact float32 views for engines' CPU shared-memory collectives, which take floating point only.

vLLM's `shm_all_gather`/`shm_gather` and SGLang's `sgl_kernel.shm_allgather` copy bytes; a float32 view of an
int64 or float64 tensor (token ids, control words, the sharded exchange's (max, index) pairs, generator
states) crosses them exactly, every bit pattern and NaN payload included.
"""

from __future__ import annotations

import torch

from gatherwise.engine_hooks.torch_dtypes import TORCH_LOGITS_DTYPES

FLOAT_DTYPES = frozenset(TORCH_LOGITS_DTYPES.values())  # what the shared-memory ops take as they are


def float_view(t: torch.Tensor) -> torch.Tensor | None:
    """`t` when its dtype is one the ops take, else a float32 view of its bytes; None when there is no such view
    (not contiguous, or a byte count that is no multiple of 4)."""
    if t.dtype in FLOAT_DTYPES:
        return t
    if not t.is_contiguous() or (t.numel() * t.element_size()) % 4:
        return None
    return t.view(-1).view(torch.uint8).view(torch.float32)
