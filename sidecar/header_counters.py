"""Ring header (engine_hooks.shm_format.ring.RingHeader) -> the exact counters the sidecar exports.

The header's cumulative counters are written by the engine on every call, so they are exact even when records
were overwritten before the sidecar read them, and they survive sidecar restarts.
"""

from __future__ import annotations

from engine_hooks.modes import IMPLEMENTED, Mode
from engine_hooks.shm_format.ring import RingHeader
from sidecar.metrics import RankCounters

# (op, mode) pairs that move bytes: all_gather mode runs all_gather; gather mode runs gather + broadcast.
BYTES_SERIES = (("all_gather", Mode.ALL_GATHER), ("gather", Mode.GATHER), ("broadcast", Mode.GATHER))


def rank_counters(header: RingHeader, rank: int, dropped: int) -> RankCounters:
    calls = {m.label: header.counters[int(m)].calls for m in IMPLEMENTED}
    nbytes = {(op, m.label): header.counters[int(m)].ops[op].bytes for op, m in BYTES_SERIES}
    return RankCounters(rank, calls, nbytes, dropped)


def total_calls(header: RingHeader) -> int:
    return sum(c.calls for c in header.counters.values())
