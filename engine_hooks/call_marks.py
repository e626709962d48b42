"""One logits call's marks: CallMarks, the one record every CallRecorder receives, `record(marks)`.

The path (gatherwise.engine_hooks.logits_path) fills one per call, the ring writers (RingRecorder and the
compiled engine_hooks/_ring_writer.c) turn it into a record and counters, the CUDA resolver
(gatherwise.engine_hooks.cuda_timing) keeps copies until their events completed, the sweep reads its phases.

Why a mutable record with slots, refilled by every call: it is filled on the engine's hot path, once per call,
where allocating a record per call (a NamedTuple, a dataclass instance) costs more than the whole compiled
record() it feeds (measured: a NamedTuple per call made recording 40 % dearer). So each path owns one CallMarks
and refills its fields (plain slot stores), and the compiled writer reads the slots in place, at offsets it
takes from the class once (the class and the order of MARKS are checked when a writer is built, and the
compiled writer's own list of names against MARKS at import: gatherwise.engine_hooks.recorder). A recorder
reads the marks during record() only; one that keeps them keeps `marks.copy()`.

Clock marks (t_start .. t_end) are the path's clock values: ns, or event tokens under a CUDA EventClock; 0
means "no such mark". The second_* marks time a call's second operation: gather mode's token broadcast, or
sharded mode's second collective (shard_resolve); 0 when the call ran none.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass(slots=True)
class CallMarks:
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

    def copy(self) -> CallMarks:
        """A copy to keep beyond record() (the path refills its own record at the next call)."""
        return replace(self)

    def clock_marks(self) -> tuple[int, ...]:
        """t_start .. t_end: the marks read from the path's clock."""
        return tuple(getattr(self, name) for name in CLOCK_MARKS)

    def with_clock_marks(self, clock_marks: list[int]) -> CallMarks:
        """A copy with its clock marks (t_start .. t_end) replaced, e.g. event tokens converted to ns."""
        if len(clock_marks) != len(CLOCK_MARKS):
            raise ValueError(f"a call has {len(CLOCK_MARKS)} clock marks, got {len(clock_marks)}")
        return replace(self, **dict(zip(CLOCK_MARKS, clock_marks, strict=True)))


MARKS: tuple[str, ...] = tuple(f.name for f in fields(CallMarks))
_T_START, _T_END = MARKS.index("t_start"), MARKS.index("t_end")
CLOCK_MARKS = MARKS[_T_START:_T_END + 1]
