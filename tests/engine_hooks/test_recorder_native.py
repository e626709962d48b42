"""The compiled record() writes exactly the bytes of the pure-Python one (ring format unchanged)."""

import os
from dataclasses import astuple, replace

import pytest

from gatherwise.engine_hooks import recorder as recorder_module
from gatherwise.engine_hooks.call_marks import MARKS, CallMarks
from gatherwise.engine_hooks.recorder import PURE_PYTHON_ENV, RingRecorder
from gatherwise.modes import Mode
from gatherwise.shm_format import ring as fmt

native = pytest.importorskip("gatherwise.engine_hooks._ring_writer",
                             reason="the compiled record writer was not built (no C compiler at install)")

VALUES = (  # (call_index, mode, rows, epoch, nbytes, t_start, coll_start, coll_end,
           #  second_start, second_end, sample_start, sample_end, t_end): CallMarks' field order
    (0, 0, 1, 0, 128_008, 1_000, 1_100, 1_500, 0, 0, 1_500, 1_900, 2_000),
    (1, 1, 16, 3, 9_732_608, 5_000, 5_010, 6_000, 6_500, 6_900, 6_000, 6_400, 7_000),
    (2, 1, 3, 3, 3_000, 8_000, 8_010, 8_020, 8_030, 8_040, 8_020, 8_020, 8_050),  # a rank that did not sample
    (3, 0, 7, 4, 1_000, 10_000, 10_000, 10_000 + 5 * 10**9, 0, 0, 10_000, 10_000, 10_000 + 6 * 10**9),  # > 4.29 s
    (4, 1, 2, 4, 2_000, 20_000, 19_000, 21_000, 21_500, 21_400, 21_000, 21_100, 22_000),  # clocks backwards
    (5, 2, 4, 5, 4_000, 30_000, 30_100, 30_200, 0, 0, 30_200, 30_300, 30_400),  # sharded, one collective
    # sharded with shard_resolve: + (resolve_nbytes, topp_rows, fallback_rows)
    (6, 2, 8, 5, 96, 40_000, 40_010, 40_030, 40_040, 40_090, 40_000, 40_035, 40_100, 500, 5, 3),
    # + the call's tag (top-p with logprobs, its table said sharded; bits beyond the tag's 6 are dropped)
    (7, 0, 8, 5, 96, 50_000, 50_010, 50_030, 0, 0, 50_030, 50_035, 50_100, 0, 0, 0, 12 | 2 << 4 | 1 << 9),
)
CALLS = [CallMarks(*values) for values in VALUES]


def _write(path: str, pure: bool, monkeypatch: pytest.MonkeyPatch) -> bytes:
    monkeypatch.setenv(PURE_PYTHON_ENV, "1" if pure else "0")
    rec = RingRecorder(path, engine_id=9, rank=1, tp_size=2, vocab=32000, dtype="bfloat16", capacity=4)
    assert rec.native is not pure
    for call in CALLS:  # 6 calls into 4 slots: the ring wraps
        rec.record(call)
    assert rec.write_index == len(CALLS)
    with open(path, "rb") as f:
        data = f.read()
    rec.close(unlink=True)
    return data


def test_compiled_and_python_writers_produce_identical_rings(tmp_path, monkeypatch):
    python = _write(str(tmp_path / "py"), True, monkeypatch)
    compiled = _write(str(tmp_path / "c"), False, monkeypatch)
    # the headers differ only in creation times and pid (bytes 48..56 created_ns, 64..68 pid, 72..80 mono)
    mask = [*range(48, 56), *range(64, 68), *range(72, 80)]
    strip = lambda b: bytes(0 if i in mask else x for i, x in enumerate(b))
    assert strip(python) == strip(compiled)
    assert fmt.HEADER_FIXED.unpack_from(compiled, 0)[11] == len(CALLS)


def test_layout_constants_match_the_format():
    built_in = (native.HEADER_SIZE, native.RECORD_SIZE, native.WRITE_INDEX_OFFSET, native.COUNTERS_OFFSET,
                native.NUM_OPS, native.NUM_MODE_ROWS)
    assert built_in == (fmt.HEADER_SIZE, fmt.RECORD_SIZE, fmt.WRITE_INDEX_OFFSET, fmt.COUNTERS_OFFSET, len(fmt.OPS),
                        fmt.NUM_MODE_ROWS)
    assert native.MARKS == MARKS  # record() reads the marks in the order they are defined
    assert tuple((m.name, int(m)) for m in Mode) == native.MODES


def test_closed_ring_refuses_records(tmp_path, monkeypatch):
    monkeypatch.delenv(PURE_PYTHON_ENV, raising=False)
    rec = RingRecorder(tmp_path / "r", engine_id=9, rank=0, tp_size=1, vocab=10, dtype="float32", capacity=2)
    rec.close()
    with pytest.raises(ValueError, match="closed"):
        rec.record(CALLS[0])


def test_the_python_fallback_runs_without_the_compiled_module(tmp_path, monkeypatch):
    monkeypatch.setattr(recorder_module, "_ring_writer", None)
    monkeypatch.delenv(PURE_PYTHON_ENV, raising=False)
    rec = RingRecorder(os.fspath(tmp_path / "r"), engine_id=9, rank=0, tp_size=1, vocab=10, dtype="float32",
                       capacity=2)
    assert not rec.native
    rec.record(CALLS[0])
    assert rec.write_index == 1
    rec.close()


def test_marks_built_by_name_are_written_like_the_python_writer(tmp_path, monkeypatch):
    """Marks built by name reach both writers alike; CallMarks refuses unknown, missing and repeated marks, and
    the compiled writer anything but one CallMarks (a plain tuple, loose marks, names)."""
    files = []
    for pure in (True, False):
        monkeypatch.setenv(PURE_PYTHON_ENV, "1" if pure else "0")
        path = str(tmp_path / f"kw-{pure}")
        rec = RingRecorder(path, engine_id=9, rank=0, tp_size=2, vocab=32000, dtype="float32", capacity=4)
        rec.record(CallMarks(0, 2, 4, 1, 96, 1_000, 1_100, 2_000, 3_000, 3_500, 2_000, 2_900, 4_000,
                             resolve_nbytes=512, topp_rows=4, fallback_rows=1))
        rec.record(CallMarks(1, 0, 1, 1, 128, t_start=5_000, coll_start=5_100, coll_end=5_500, second_start=0,
                             second_end=0, sample_start=5_500, sample_end=5_900, t_end=6_000))
        with open(path, "rb") as f:
            files.append(f.read()[fmt.HEADER_SIZE:])  # the records (headers differ in creation times)
        if not pure:
            with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
                CallMarks(*VALUES[0], bogus=1)  # type: ignore[call-arg]  # the wrong call under test
            with pytest.raises(TypeError, match="missing 1 required positional argument: 't_end'"):
                CallMarks(*VALUES[0][:12])  # type: ignore[call-arg]  # as above
            with pytest.raises(TypeError, match="multiple values for argument 'tag'"):
                CallMarks(*VALUES[7], tag=1)  # type: ignore[misc]  # as above
            with pytest.raises(TypeError, match="record\\(\\) takes one call's CallMarks, got tuple"):
                rec.record(VALUES[0])  # type: ignore[arg-type]  # as above
            with pytest.raises(TypeError, match="takes exactly one argument"):
                rec.record(*VALUES[0])  # type: ignore[arg-type, call-arg]  # as above
            with pytest.raises(TypeError, match="takes no keyword arguments"):
                rec.record(marks=CALLS[0])  # type: ignore[call-arg]  # as above
            unset = CallMarks.__new__(CallMarks)  # no __init__: every slot empty
            with pytest.raises(AttributeError, match=r"CallMarks\.call_index is not set"):
                rec.record(unset)
        rec.close(unlink=True)
    assert files[0] == files[1]


def test_one_record_refilled_per_call_writes_what_a_new_record_per_call_writes(tmp_path, monkeypatch):
    """The path refills one CallMarks per call: the compiled writer reads the values of the moment."""
    files = []
    for refill in (False, True):
        monkeypatch.setenv(PURE_PYTHON_ENV, "0")
        path = str(tmp_path / f"refill-{refill}")
        rec = RingRecorder(path, engine_id=9, rank=1, tp_size=2, vocab=32000, dtype="bfloat16", capacity=8)
        marks = CallMarks(*[0] * 13)
        for values in VALUES:
            if refill:
                for name, value in zip(MARKS, astuple(CallMarks(*values)), strict=True):
                    setattr(marks, name, value)
                rec.record(marks)
            else:
                rec.record(CallMarks(*values))
        with open(path, "rb") as f:
            files.append(f.read()[fmt.HEADER_SIZE:])
        rec.close(unlink=True)
    assert files[0] == files[1]


def test_the_compiled_writer_needs_the_marks_as_slots():
    """It reads CallMarks' slots in place, so it refuses a class whose marks are not plain slots."""

    class NotSlots:
        pass

    for name in MARKS:
        setattr(NotSlots, name, 0)
    with pytest.raises(TypeError, match=r"CallMarks\.call_index is not a slot"):
        native.Writer(bytearray(fmt.ring_file_size(2)), 2, 10, 0, 0, NotSlots)


def test_clock_marks_are_replaced_in_a_copy():
    """The CUDA resolver's conversion: the eight clock marks replaced, the rest kept, the original untouched."""
    call = CALLS[6]
    before = call.copy()
    ns = list(range(1, 9))
    timed = call.with_clock_marks(ns)
    assert isinstance(timed, CallMarks) and call == before
    assert replace(timed, t_start=call.t_start, coll_start=call.coll_start, coll_end=call.coll_end,
                          second_start=call.second_start, second_end=call.second_end,
                          sample_start=call.sample_start, sample_end=call.sample_end, t_end=call.t_end) == call
    assert (timed.t_start, timed.t_end) == (1, 8)
    with pytest.raises(ValueError, match="8 clock marks, got 7"):
        call.with_clock_marks(ns[:7])


def test_the_compiled_writer_is_used_only_for_the_ring_layout_it_was_built_for():
    """A stale in-place build (an older ring format) must never write rings: the recorder checks its layout."""
    assert recorder_module._native_matches_format(native)

    class StaleBuild:  # stand-in for a compiled writer built from an earlier ring format
        FORMAT_VERSION = fmt.FORMAT_VERSION - 1
        HEADER_SIZE, RECORD_SIZE, NUM_MODE_ROWS = fmt.HEADER_SIZE, fmt.RECORD_SIZE, fmt.NUM_MODE_ROWS
        WRITE_INDEX_OFFSET, COUNTERS_OFFSET, TOPP_ROWS_OFFSET = (
            fmt.WRITE_INDEX_OFFSET, fmt.COUNTERS_OFFSET, fmt.TOPP_ROWS_OFFSET)
        NUM_OPS, TAG_SHIFT = len(fmt.OPS), fmt.TAG_SHIFT
        MARKS, MODES = native.MARKS, native.MODES
        MODE_FIRST_OPS, MODE_SECOND_FLAGS = native.MODE_FIRST_OPS, native.MODE_SECOND_FLAGS

    assert not recorder_module._native_matches_format(StaleBuild)
    StaleBuild.FORMAT_VERSION = fmt.FORMAT_VERSION
    assert recorder_module._native_matches_format(StaleBuild)
    del StaleBuild.TAG_SHIFT  # built before records carried call tags: record() would refuse `tag`
    assert not recorder_module._native_matches_format(StaleBuild)
    StaleBuild.TAG_SHIFT = fmt.TAG_SHIFT
    StaleBuild.MARKS = (*MARKS[:8], MARKS[9], MARKS[8], *MARKS[10:])  # reads the marks in another order
    assert not recorder_module._native_matches_format(StaleBuild)
    StaleBuild.MARKS = MARKS
    StaleBuild.MODE_FIRST_OPS = (0, 1, 1)  # a sharded call counted under gather
    assert not recorder_module._native_matches_format(StaleBuild)
    StaleBuild.MODE_FIRST_OPS = native.MODE_FIRST_OPS
    StaleBuild.MODES = tuple((m, c) for m, c in reversed(native.MODES))
    assert not recorder_module._native_matches_format(StaleBuild)
    StaleBuild.MODES = native.MODES
    StaleBuild.NUM_OPS = len(fmt.OPS) - 1
    assert not recorder_module._native_matches_format(StaleBuild)
