"""Ring header (gatherwise.shm_format.ring.RingHeader) -> the exact counters the sidecar exports.

The header's cumulative counters are written by the engine on every call (calls and bytes at the time of the
call, times once known), so they are exact even when records were overwritten before the sidecar read them, and
they survive sidecar restarts: a restarted sidecar exports the same values, not values counted from its start.
"""

from __future__ import annotations

from gatherwise.modes import IMPLEMENTED, Mode
from gatherwise.shm_format.ring import MODE_OPS, RingHeader
from sidecar.metrics import RankCounters


def bytes_series(modes: tuple[Mode, ...] = IMPLEMENTED) -> tuple[tuple[str, Mode], ...]:
    """(op, mode) pairs that move bytes: each mode's operations (MODE_OPS), e.g. gather runs gather + broadcast."""
    return tuple((op, m) for m in modes for op in MODE_OPS[int(m)] if op)


def seconds_series(modes: tuple[Mode, ...] = IMPLEMENTED) -> tuple[tuple[str, Mode], ...]:
    """(op, mode) pairs that take time: the mode's collectives, sampling and the whole path."""
    return bytes_series(modes) + tuple((op, m) for m in modes for op in ("sample", "path"))


# header op name -> the `op` label (the whole path is labelled like its histogram family)
OP_LABELS = {"path": "logits_path"}


def rank_counters(header: RingHeader, rank: int, reader_dropped: dict[str, int]) -> RankCounters:
    """One rank's counters. `reader_dropped`: this sidecar's own losses by reason (overwritten, torn); the
    engine's (timings given up) come from the header."""
    rows = header.counters
    calls = {m.label: rows[int(m)].calls for m in IMPLEMENTED}
    nbytes = {(op, m.label): rows[int(m)].ops[op].bytes for op, m in bytes_series()}
    seconds = {(OP_LABELS.get(op, op), m.label): rows[int(m)].ops[op].ns / 1e9 for op, m in seconds_series()}
    path_bytes = {m.label: rows[int(m)].ops["path"].bytes for m in IMPLEMENTED}
    return RankCounters(rank, calls, nbytes, {**reader_dropped, **header.drops}, seconds, path_bytes,
                        header.topp_rows, header.topp_fallback_rows)


def total_calls(header: RingHeader) -> int:
    return sum(c.calls for c in header.counters.values())
