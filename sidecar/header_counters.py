"""Ring header (engine_hooks.shm_format.ring.RingHeader) -> the exact counters the sidecar exports.

The header's cumulative counters are written by the engine on every call (calls and bytes at the time of the
call, times once known), so they are exact even when records were overwritten before the sidecar read them, and
they survive sidecar restarts: a restarted sidecar exports the same values, not values counted from its start.
"""

from __future__ import annotations

from engine_hooks.modes import IMPLEMENTED, Mode
from engine_hooks.shm_format.ring import RingHeader
from sidecar.metrics import RankCounters

# (op, mode) pairs that move bytes: all_gather mode runs all_gather; gather mode runs gather + broadcast.
BYTES_SERIES = (("all_gather", Mode.ALL_GATHER), ("gather", Mode.GATHER), ("broadcast", Mode.GATHER))
# (op, mode) pairs that take time: the collectives above, sampling and the whole path in every mode.
SECONDS_SERIES = BYTES_SERIES + tuple((op, m) for m in IMPLEMENTED for op in ("sample", "path"))
# header op name -> the `op` label (the whole path is labelled like its histogram family)
OP_LABELS = {"path": "logits_path"}


def rank_counters(header: RingHeader, rank: int, reader_dropped: dict[str, int]) -> RankCounters:
    """One rank's counters. `reader_dropped`: this sidecar's own losses by reason (overwritten, torn); the
    engine's (timings given up) come from the header."""
    rows = header.counters
    calls = {m.label: rows[int(m)].calls for m in IMPLEMENTED}
    nbytes = {(op, m.label): rows[int(m)].ops[op].bytes for op, m in BYTES_SERIES}
    seconds = {(OP_LABELS.get(op, op), m.label): rows[int(m)].ops[op].ns / 1e9 for op, m in SECONDS_SERIES}
    path_bytes = {m.label: rows[int(m)].ops["path"].bytes for m in IMPLEMENTED}
    return RankCounters(rank, calls, nbytes, {**reader_dropped, **header.drops}, seconds, path_bytes)


def total_calls(header: RingHeader) -> int:
    return sum(c.calls for c in header.counters.values())
