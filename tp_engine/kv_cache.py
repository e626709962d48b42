"""Slot-based KV cache: each running request owns one slot (a row of every layer's K and V tensors)."""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, num_layers: int, num_slots: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu") -> None:
        shape = (num_slots, kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.num_slots, self.max_len = num_slots, max_len
        self._free = list(range(num_slots - 1, -1, -1))

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError(f"KV cache full: all {self.num_slots} slots are in use")
        return self._free.pop()

    def release(self, slot: int) -> None:
        self._free.append(slot)

    def reset(self) -> None:
        self._free = list(range(self.num_slots - 1, -1, -1))

    def write(self, layer: int, slots: torch.Tensor, positions: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> None:
        """k, v: [T, kv_heads, head_dim] for tokens at (slots[t], positions[t])."""
        if int(positions.max()) >= self.max_len:
            raise RuntimeError(f"position {int(positions.max())} exceeds the KV cache length {self.max_len}")
        self.k[layer][slots, :, positions] = k
        self.v[layer][slots, :, positions] = v

    def read(self, layer: int, slots: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of positions [0, length) of each token's slot: [T, kv_heads, length, head_dim] each."""
        return self.k[layer][slots, :, :length], self.v[layer][slots, :, :length]
