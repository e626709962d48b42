"""Full-vocab logits for a rank that will not sample (gather mode, ranks other than 0).

The engine still runs its own logits post-processing on them (scaling, penalties, masks, NaN checks) before it
reaches the sampler gatherwise skips, so they must have the real shape, dtype and device; their values are
never used. One buffer is kept and grown, never reallocated per call.
"""

from __future__ import annotations

import torch


class PlaceholderLogits:
    def __init__(self) -> None:
        self._buffer = torch.empty(0)

    def get(self, rows: int, cols: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A [rows, cols] zero-initialised view (engines may write into it in place; nothing reads it back)."""
        b = self._buffer
        if b.shape[0] < rows or b.shape[1:] != (cols,) or b.dtype != dtype or b.device != device:
            self._buffer = b = torch.zeros(max(rows, 2 * b.shape[0]), cols, dtype=dtype, device=device)
        return b[:rows]
