"""One logits call's marks: CallMarks, the one record every CallRecorder receives, `record(marks)`.

The path (gatherwise.engine_hooks.logits_path) builds one per call, the ring writers (RingRecorder and the
compiled engine_hooks/_ring_writer.c) turn it into a record and counters, the CUDA resolver
(gatherwise.engine_hooks.cuda_timing) keeps it until its events completed, the sweep reads its phases.

Why a NamedTuple: it is a tuple, so the compiled writer reads its items straight from the tuple's array (no
attribute lookups), and a tuple is immutable, so a recorder may keep it (the CUDA resolver does). It is built
once per call on the engine's hot path, where the generated keyword constructor would cost more than the
whole compiled record() it feeds: the path builds it with `tuple.__new__(CallMarks, values)` (one C call,
positional in field order), everything off the hot path by name, `CallMarks(call_index=..., ...)`. The compiled
writer's own list of field names is checked against MARKS at import (gatherwise.engine_hooks.recorder).

Clock marks (t_start .. t_end) are the path's clock values: ns, or event tokens under a CUDA EventClock; 0
means "no such mark". The second_* marks time a call's second operation: gather mode's token broadcast, or
sharded mode's second collective (shard_resolve); 0 when the call ran none.
"""

from __future__ import annotations

from typing import NamedTuple


class CallMarks(NamedTuple):
    call_index: int  # the path's call index (the same on every rank)
    mode: int  # the mode the call ran (gatherwise.modes.Mode)
    rows: int
    epoch: int  # the table epoch of the call
    nbytes: int  # bytes this rank's first collective moved
    t_start: int  # logits ready
    coll_start: int  # the first collective
    coll_end: int
    second_start: int  # the second operation (token broadcast, or shard_resolve)
    second_end: int
    sample_start: int  # sampling (sample_start == sample_end: this rank did not sample)
    sample_end: int
    t_end: int  # tokens ready
    resolve_nbytes: int = 0  # bytes of shard_resolve (sharded mode; a broadcast's bytes follow from rows)
    topp_rows: int = 0  # top-p rows of a sharded call
    fallback_rows: int = 0  # of those, rows that took the full-row fallback
    tag: int = 0  # what the call sampled and the mode its table named (gatherwise.call_kind.call_tag)

    def clock_marks(self) -> tuple[int, ...]:
        """t_start .. t_end: the marks read from the path's clock."""
        return self[_T_START:_T_END + 1]

    def with_clock_marks(self, clock_marks: list[int]) -> CallMarks:
        """The same call with its clock marks (t_start .. t_end) replaced, e.g. event tokens converted to ns."""
        if len(clock_marks) != _T_END + 1 - _T_START:
            raise ValueError(f"a call has {_T_END + 1 - _T_START} clock marks, got {len(clock_marks)}")
        return tuple.__new__(CallMarks, (*self[:_T_START], *clock_marks, *self[_T_END + 1:]))


MARKS: tuple[str, ...] = CallMarks._fields
_T_START, _T_END = MARKS.index("t_start"), MARKS.index("t_end")
