"""One logits call's marks, as every CallRecorder receives them: `record(*marks)`, positional, in MARKS order.

The path (gatherwise.engine_hooks.logits_path) passes them once per call, the ring writers (RingRecorder and
the compiled engine_hooks/_ring_writer.c) turn them into a record and counters, the CUDA resolver
(gatherwise.engine_hooks.cuda_timing) keeps them until their events completed, the sweep reads its phases.

Why positional marks and not one object: they are passed on the engine's hot path, once per call. A
NamedTuple or dataclass is built by a Python-level constructor that costs more than the whole compiled
record() it feeds (measured: about 2.5x); even a plain tuple is one more allocation and slowed the compiled
record() by about a quarter, while positional arguments reach it (METH_FASTCALL) with no allocation at all. So
the names are defined here once, as MARKS and index constants: a recorder written in Python takes `*marks`
(a CallMarks tuple) and indexes or unpacks it in MARKS order, code off the hot path builds marks by name with
call_marks() and passes them as `record(*marks)`, and the compiled writer's own list of names is checked
against MARKS at import (gatherwise.engine_hooks.recorder).

Clock marks (t_start .. t_end) are the path's clock values: ns, or event tokens under a CUDA EventClock; 0
means "no such mark". The second_* marks time a call's second operation: gather mode's token broadcast, or
sharded mode's second collective (shard_resolve); 0 when the call ran none.
"""

from __future__ import annotations

CallMarks = tuple[int, ...]  # one int per name in MARKS, in that order (what `*marks` collects)

MARKS = (
    "call_index",  # the path's call index (the same on every rank)
    "mode",  # the mode the call ran (gatherwise.modes.Mode)
    "rows",
    "epoch",  # the table epoch of the call
    "nbytes",  # bytes this rank's first collective moved
    "t_start",  # logits ready
    "coll_start",  # the first collective
    "coll_end",
    "second_start",  # the second operation (token broadcast, or shard_resolve)
    "second_end",
    "sample_start",  # sampling (sample_start == sample_end: this rank did not sample)
    "sample_end",
    "t_end",  # tokens ready
    "resolve_nbytes",  # bytes of shard_resolve (sharded mode; a broadcast's bytes follow from rows)
    "topp_rows",  # top-p rows of a sharded call
    "fallback_rows",  # of those, rows that took the full-row fallback
    "tag",  # what the call sampled and the mode its table named (gatherwise.call_kind.call_tag)
)
(CALL_INDEX, MODE, ROWS, EPOCH, NBYTES, T_START, COLL_START, COLL_END, SECOND_START, SECOND_END, SAMPLE_START,
 SAMPLE_END, T_END, RESOLVE_NBYTES, TOPP_ROWS, FALLBACK_ROWS, TAG) = range(len(MARKS))
assert all(globals()[name.upper()] == i for i, name in enumerate(MARKS))  # the constants name MARKS in order

CLOCK_MARKS = slice(T_START, T_END + 1)  # the marks read from the path's clock
OPTIONAL = frozenset(MARKS[RESOLVE_NBYTES:])  # 0 unless a call has them
NUM_REQUIRED = RESOLVE_NBYTES


def call_marks(*marks: int, **named: int) -> CallMarks:
    """Marks from values in MARKS order and/or by name; the optional ones default to 0. Off the hot path only
    (tests, benches, synthetic writers): the path builds its tuple directly."""
    if len(marks) > len(MARKS):
        raise TypeError(f"a call has {len(MARKS)} marks, got {len(marks)}")
    values: list[int | None] = [*marks, *([None] * (len(MARKS) - len(marks)))]
    for name, value in named.items():
        if name not in MARKS:
            raise TypeError(f"unexpected mark {name!r}")
        i = MARKS.index(name)
        if values[i] is not None:
            raise TypeError(f"mark {name!r} given twice")
        values[i] = value
    filled: list[int] = []
    for name, given in zip(MARKS, values, strict=True):
        if given is None and name not in OPTIONAL:
            raise TypeError(f"missing required mark {name!r}")
        filled.append(0 if given is None else given)
    return tuple(filled)


def with_clock_marks(marks: CallMarks, clock_marks: list[int]) -> CallMarks:
    """The same call with its clock marks replaced (e.g. event tokens converted to ns)."""
    return marks[:T_START] + tuple(clock_marks) + marks[T_END + 1:]


def marks_by_name(marks: CallMarks) -> dict[str, int]:
    """{name: value} of one call's marks (for tests and reports, not the hot path)."""
    return dict(zip(MARKS, marks, strict=True))
