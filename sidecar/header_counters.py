"""Ring header (engine_hooks.shm_format.ring.RingHeader) -> the exact counters the sidecar exports.

The header's cumulative counters are written by the engine on every call, so they are exact even when records
were overwritten before the sidecar read them, and they survive sidecar restarts.
"""

from __future__ import annotations

from engine_hooks.modes import IMPLEMENTED, Mode
from engine_hooks.shm_format.ring import MODE_OPS, RingHeader
from sidecar.metrics import RankCounters


def bytes_series(modes: tuple[Mode, ...] = IMPLEMENTED) -> tuple[tuple[str, Mode], ...]:
    """(op, mode) pairs that move bytes: each mode's operations (MODE_OPS), e.g. gather runs gather + broadcast."""
    return tuple((op, m) for m in modes for op in MODE_OPS[int(m)] if op)


def rank_counters(header: RingHeader, rank: int, dropped: int) -> RankCounters:
    calls = {m.label: header.counters[int(m)].calls for m in IMPLEMENTED}
    nbytes = {(op, m.label): header.counters[int(m)].ops[op].bytes for op, m in bytes_series()}
    return RankCounters(rank, calls, nbytes, dropped, header.topp_rows, header.topp_fallback_rows)


def total_calls(header: RingHeader) -> int:
    return sum(c.calls for c in header.counters.values())
