"""Deferred adoption of the control word: no rank reads a device value on the host inside the call that sent it.

The control word of call k arrives on every rank inside call k's own collective, on the device. Reading it
right away (`.item()`) would be a device→host synchronization per call on CUDA: the host would stop launching
work until the collective finished, and a CUDA graph could not contain the call. Instead every rank enqueues a
non-blocking copy of the received word into a pinned host slot (plus an event after it) and adopts it at the
start of call k + ADOPT_LAG. By then the engine has consumed the tokens of call k on the host (every engine
does before it schedules the next-but-one step), so the copy has long completed and the event query is free.
If it has not (the host ran more than ADOPT_LAG calls ahead of the device), the rank waits for that one event:
correctness never depends on timing, and such waits are counted in `waits`.

Every rank runs the same code with the same lag, so every rank switches at the same call. On CPU the copy is
simply synchronous and there is no event: the multi-rank CPU tests exercise exactly the lag the GPU runs.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Protocol

import torch

# A request rank 0 reads at the start of call k rides in call k's collective and runs from call k + ADOPT_LAG
# on every rank. 2 leaves one whole call for the copy to land before anybody reads it; it is part of the
# protocol (reported as `apply_call`), so it never changes at run time.
ADOPT_LAG = 2


class ReadyEvent(Protocol):
    """The part of torch.cuda.Event used here."""

    def record(self) -> None: ...

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


def _cuda_event() -> ReadyEvent:
    return torch.cuda.Event()  # no timing: the cheapest kind


class DeferredWords:
    """ADOPT_LAG pinned host slots: stash(k, word) during call k, take(k + ADOPT_LAG) at the start of that call."""

    def __init__(self, device: torch.device | str, *, lag: int = ADOPT_LAG,
                 event_factory: Callable[[], ReadyEvent] | None = None) -> None:
        if lag < 1:
            raise ValueError(f"the adoption lag must be >= 1 call, got {lag}")
        device = torch.device(device)
        self.lag = lag
        on_cuda = device.type == "cuda"
        self._host = torch.zeros(lag, dtype=torch.int64, pin_memory=on_cuda)
        # Read slots through ctypes: a host memory load, cheaper than Tensor.item() and never a device op.
        self._view = (ctypes.c_int64 * lag).from_address(self._host.data_ptr())
        factory = event_factory if event_factory is not None else (_cuda_event if on_cuda else None)
        self._events: list[ReadyEvent] | None = [factory() for _ in range(lag)] if factory is not None else None
        self._filled_for: list[int | None] = [None] * lag  # call index whose word each slot holds
        self.waits = 0  # adoptions that had to wait for the copy: the host ran > lag calls ahead of the device

    def stash(self, call_index: int, word: torch.Tensor) -> None:
        """Enqueue the copy of call `call_index`'s received word (one int64 element, on the device)."""
        slot = call_index % self.lag
        self._host[slot: slot + 1].copy_(word, non_blocking=True)
        if self._events is not None:
            self._events[slot].record()
        self._filled_for[slot] = call_index

    def take(self, call_index: int) -> int | None:
        """The word that runs from call `call_index` on (stashed at call_index - lag), or None if none was."""
        slot = call_index % self.lag
        if self._filled_for[slot] != call_index - self.lag:
            return None
        if self._events is not None:
            event = self._events[slot]
            if not event.query():
                self.waits += 1
                event.synchronize()
        return self._view[slot]
