"""The telemetry ring: RingRecorder (writer) and RingReader (sidecar side) against the format in shm_format/ring.py."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import struct
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest

from gatherwise.engine_hooks.call_marks import CallMarks
from gatherwise.engine_hooks.recorder import RingRecorder
from gatherwise.logits_dtypes import dtype_code, dtype_name
from gatherwise.modes import Mode
from gatherwise.shm_format import ring as fmt
from gatherwise.sidecar.ingest.ring_reader import RingFormatError, RingReader, discover_engines


def make_recorder(tmp_path, capacity=16, rank=0, engine_id=0x1234ABCD, name=None):
    path = tmp_path / (name or f"rank-{rank}")
    return RingRecorder(path, engine_id=engine_id, rank=rank, tp_size=2, vocab=32000, dtype="float32",
                        capacity=capacity)


def write_call(rec, i, mode=Mode.ALL_GATHER, rows=3, base=1_000_000):
    """A call i with distinct, checkable marks; gather-mode calls broadcast."""
    t0 = base + 1000 * i
    if mode == Mode.ALL_GATHER:
        rec.record(CallMarks(i, mode, rows, i // 4, 100 + i, t0, t0 + 10, t0 + 110, 0, 0, t0 + 110, t0 + 140,
                               t0 + 150))
    else:
        rec.record(CallMarks(i, mode, rows, i // 4, 100 + i, t0, t0 + 10, t0 + 60, t0 + 80, t0 + 130, t0 + 60,
                               t0 + 80, t0 + 150))


def test_round_trip_fields(tmp_path):
    rec = make_recorder(tmp_path)
    reader = RingReader(rec.path)
    write_call(rec, 0, Mode.ALL_GATHER, rows=5)
    write_call(rec, 1, Mode.GATHER, rows=7)
    records, missed = reader.read_new()
    assert missed == 0
    a, g = records
    assert (a.seq, a.call_index, a.mode, a.rows, a.vocab, a.dtype, a.rank, a.epoch, a.nbytes) == \
        (1, 0, Mode.ALL_GATHER, 5, 32000, "float32", 0, 0, 100)
    assert (a.start_ns, a.collective_start_ns, a.collective_ns) == (1_000_000, 1_000_010, 100)
    assert (a.second_start_ns, a.second_ns) == (0, 0)
    assert (a.sample_start_ns, a.sample_ns, a.end_ns, a.path_ns) == (1_000_110, 30, 1_000_150, 150)
    assert (g.seq, g.mode, g.rows, g.nbytes) == (2, Mode.GATHER, 7, 101)
    assert (g.collective_start_ns, g.collective_ns) == (1_001_010, 50)
    assert (g.second_start_ns, g.second_ns) == (1_001_080, 50)
    assert (g.sample_start_ns, g.sample_ns, g.end_ns) == (1_001_060, 20, 1_001_150)
    assert reader.read_new() == ([], 0)


def test_header_identity_and_counters(tmp_path):
    rec = make_recorder(tmp_path, rank=1, engine_id=(1 << 63) + 5)
    for i in range(6):
        write_call(rec, i, Mode.GATHER if i % 3 == 0 else Mode.ALL_GATHER, rows=2)
    h = RingReader(rec.path).header()
    assert (h.version, h.engine_id, h.rank, h.tp_size, h.vocab, h.dtype) == \
        (fmt.FORMAT_VERSION, (1 << 63) + 5, 1, 2, 32000, "float32")
    assert (h.capacity, h.record_size, h.write_index, h.writer_pid, h.closed) == (16, fmt.RECORD_SIZE, 6, os.getpid(),
                                                                                  False)
    ag, ga = h.counters[Mode.ALL_GATHER], h.counters[Mode.GATHER]
    assert (ag.calls, ga.calls) == (4, 2)
    assert ag.ops["all_gather"] == fmt.OpCounters(4 * 100, sum(100 + i for i in (1, 2, 4, 5)))
    assert ag.ops["gather"] == ag.ops["broadcast"] == fmt.OpCounters(0, 0)
    assert ag.ops["sample"].ns == 4 * 30 and ag.ops["path"].ns == 4 * 150
    assert ga.ops["gather"] == fmt.OpCounters(2 * 50, 100 + 103)
    assert ga.ops["broadcast"] == fmt.OpCounters(2 * 50, 2 * fmt.broadcast_bytes(2))
    assert ga.ops["path"] == fmt.OpCounters(2 * 150, 100 + 103 + 2 * fmt.broadcast_bytes(2))
    assert h.counters[Mode.SHARDED].calls == 0
    assert abs(h.mono_to_wall_ns(h.created_mono_ns) - h.created_ns) == 0
    rec.close()
    assert RingReader(rec.path).header().closed


def test_dtype_codes():
    assert dtype_code("bfloat16") == dtype_code("torch.bfloat16") == 2
    assert dtype_name(dtype_code("float16")) == "float16"
    assert fmt.DTYPE_NAMES[2] == "bfloat16"  # the names ring readers show for the header's dtype field
    with pytest.raises(ValueError, match="unsupported logits dtype"):
        dtype_code("int8")


def test_wrap_around_counts_exact_missed_and_counters_stay_exact(tmp_path):
    cap = 8
    rec = make_recorder(tmp_path, capacity=cap)
    reader = RingReader(rec.path)
    for i in range(3):
        write_call(rec, i)
    records, missed = reader.read_new()
    assert [r.seq for r in records] == [1, 2, 3] and missed == 0
    for i in range(3, 23):  # 20 more records into 8 slots
        write_call(rec, i)
    records, missed = reader.read_new()
    # readable: seqs w - cap + 2 .. w (the oldest slot is the one the writer fills next)
    assert [r.seq for r in records] == list(range(23 - cap + 2, 24))
    assert missed == (23 - cap + 1) - 3
    assert [r.call_index for r in records] == [r.seq - 1 for r in records]
    assert reader.overwritten == missed and reader.torn == 0
    h = reader.header()
    assert h.write_index == 23 and h.counters[Mode.ALL_GATHER].calls == 23  # counters never lose a call
    assert h.counters[Mode.ALL_GATHER].ops["all_gather"].bytes == sum(100 + i for i in range(23))
    write_call(rec, 23)
    assert [r.seq for r in reader.read_new()[0]] == [24]


def test_start_now_and_max_records(tmp_path):
    rec = make_recorder(tmp_path, capacity=32)
    for i in range(5):
        write_call(rec, i)
    late = RingReader(rec.path, start="now")
    assert late.read_new() == ([], 0)
    for i in range(5, 15):
        write_call(rec, i)
    first, missed = late.read_new(max_records=4)
    assert [r.seq for r in first] == [6, 7, 8, 9] and missed == 0
    assert [r.seq for r in late.read_new()[0]] == list(range(10, 16))


def test_torn_record_is_detected_and_counted(tmp_path):
    rec = make_recorder(tmp_path, capacity=8)
    reader = RingReader(rec.path)
    for i in range(5):
        write_call(rec, i)
    # A half-written record in seq 3's slot: a new leading seq and half the payload, the old trailing seq.
    raw = bytearray(fmt.RECORD.pack(11, 2, 2, 2, 0, 1, 32000, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 11))
    with open(rec.path, "r+b") as f:
        f.seek(fmt.slot_offset(3, 8))
        f.write(raw[: fmt.RECORD_SIZE // 2])
    records, missed = reader.read_new()
    assert [r.seq for r in records] == [1, 2, 4, 5]
    assert missed == 1 and reader.torn == 1


def test_half_record_in_the_next_slot_is_never_returned(tmp_path):
    cap = 4
    rec = make_recorder(tmp_path, capacity=cap)
    reader = RingReader(rec.path)
    for i in range(cap):
        write_call(rec, i)
    # The writer has started seq 5 (slot of seq 1) but not published it: seq 1 must not be returned.
    with open(rec.path, "r+b") as f:
        f.seek(fmt.slot_offset(5, cap))
        f.write(struct.pack("<QQ", 5, 999))
    records, missed = reader.read_new()
    assert [r.seq for r in records] == [2, 3, 4] and missed == 1


def test_foreign_and_corrupt_files_are_rejected(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.write_bytes(b"not a ring at all" * 100)
    with pytest.raises(RingFormatError, match="not a gatherwise ring"):
        RingReader(foreign)
    tiny = tmp_path / "tiny"
    tiny.write_bytes(b"GWRING")
    with pytest.raises(RingFormatError, match="too small"):
        RingReader(tiny)
    rec = make_recorder(tmp_path, capacity=8)
    rec.close()
    data = bytearray(Path(rec.path).read_bytes())
    other_version = tmp_path / "v99"
    other_version.write_bytes(bytes(data[:8]) + struct.pack("<I", 99) + bytes(data[12:]))
    with pytest.raises(RingFormatError, match="version 99"):
        RingReader(other_version)
    truncated = tmp_path / "truncated"
    truncated.write_bytes(bytes(data[:-fmt.RECORD_SIZE]))
    with pytest.raises(RingFormatError, match="truncated or corrupt"):
        RingReader(truncated)
    bad_record_size = tmp_path / "bad_record_size"
    bad_record_size.write_bytes(bytes(data[:16]) + struct.pack("<I", 64) + bytes(data[20:]))
    with pytest.raises(RingFormatError, match="header/record size"):
        RingReader(bad_record_size)


def test_reader_never_modifies_the_file(tmp_path):
    rec = make_recorder(tmp_path, capacity=8)
    for i in range(12):
        write_call(rec, i, Mode.GATHER if i % 2 else Mode.ALL_GATHER)
    before = hashlib.sha256(Path(rec.path).read_bytes()).hexdigest()
    stat = os.stat(rec.path)
    with RingReader(rec.path) as reader:
        reader.read_new()
        reader.header()
        reader.read_new(max_records=1)
    assert hashlib.sha256(Path(rec.path).read_bytes()).hexdigest() == before
    assert os.stat(rec.path).st_mtime_ns == stat.st_mtime_ns


def test_discover_engines_newest_first(tmp_path):
    old_id, new_id = 0x00000000000000AA, 0x7FFFFFFFFFFFFFFF
    recorders = []
    for engine_id in (old_id, new_id):
        for rank in (1, 0):
            path = fmt.ring_path(tmp_path, engine_id, rank)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            recorders.append(RingRecorder(path, engine_id=engine_id, rank=rank, tp_size=2, vocab=100,
                                          dtype="float16", capacity=16))
    open(os.path.join(fmt.engine_dir(tmp_path, new_id), fmt.CONTROL_NAME), "wb").close()
    (tmp_path / "not-an-engine").mkdir()
    engines = discover_engines(tmp_path)
    assert [e.engine_id for e in engines] == [new_id, old_id]
    assert os.path.basename(engines[0].dir) == "7fffffffffffffff"
    assert list(engines[0].rings) == [0, 1] and engines[0].rings[1].name == "rank-1"
    assert engines[0].control is not None and engines[1].control is None
    assert discover_engines(tmp_path / "missing") == []


def _writer(path: str, n: int, ready: Event) -> None:
    rec = RingRecorder(path, engine_id=7, rank=0, tp_size=1, vocab=32000, dtype="float32", capacity=64)
    ready.set()
    for i in range(n):
        rows = 1 + i % 16
        t0 = 10_000 + 1000 * i
        rec.record(CallMarks(i, i % 2, rows, i, rows * 4 * 32000, t0, t0 + i % 7, t0 + 100 + i % 13, 0, 0,
                    t0 + 100 + i % 13, t0 + 200, t0 + 300))
    rec.close()


@pytest.mark.timeout(120)
def test_concurrent_writer_process_and_reader_never_misparse(tmp_path):
    """A real writer process races this reader over a small ring: every returned record is exactly right."""
    n = 60_000
    path = str(tmp_path / "rank-0")
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=_writer, args=(path, n, ready))
    proc.start()
    try:
        assert ready.wait(60)
        reader = RingReader(path)
        # the writer may already have lapped the ring before we attached: those seqs are before our cursor
        got, missed, reads_while_writing = 0, 0, 0
        start = reader.cursor
        while True:
            alive = proc.is_alive()
            records, m = reader.read_new(max_records=48)
            missed += m
            reads_while_writing += bool(records) and reader.header().write_index < n
            for r in records:
                i = r.seq - 1
                rows = 1 + i % 16
                t0 = 10_000 + 1000 * i
                assert (r.call_index, r.mode, r.rows, r.epoch, r.nbytes) == (i, i % 2, rows, i, rows * 4 * 32000)
                assert (r.start_ns, r.collective_start_ns, r.collective_ns) == (t0, t0 + i % 7, 100 + i % 13 - i % 7)
                assert (r.sample_start_ns, r.end_ns) == (t0 + 100 + i % 13, t0 + 300)
            got += len(records)
            if not alive and not records:
                break
        proc.join(30)
        assert proc.exitcode == 0
        h = reader.header()
        assert h.closed and h.write_index == n
        assert h.counters[0].calls + h.counters[1].calls == n
        assert got + missed == n - start and reader.cursor == n  # every later seq returned or counted missed
        assert reads_while_writing > 0
    finally:
        if proc.is_alive():
            proc.kill()


def test_sharded_calls_have_their_own_ops_and_fallback_counts(tmp_path):
    rec = make_recorder(tmp_path)
    reader = RingReader(rec.path)
    t0 = 1_000_000
    # one collective only (greedy rows), then two (shard_resolve) with 3 of 5 top-p rows falling back
    rec.record(CallMarks(0, Mode.SHARDED, 4, 0, 64, t0, t0 + 10, t0 + 30, 0, 0, t0, t0 + 40, t0 + 50))
    # + (resolve_nbytes, topp_rows, fallback_rows), positional in MARKS order
    rec.record(CallMarks(1, Mode.SHARDED, 8, 0, 96, t0, t0 + 10, t0 + 30, t0 + 40, t0 + 90, t0, t0 + 35, t0 + 100,
                           500, 5, 3))
    (a, b), missed = reader.read_new()
    assert missed == 0
    assert (a.second_op, a.second_start_ns, a.second_ns, a.fallback_rows) == (None, 0, 0, 0)
    assert (b.second_op, b.second_start_ns, b.second_ns, b.fallback_rows) == ("shard_resolve", t0 + 40, 50, 3)
    sh = reader.header().counters[Mode.SHARDED]
    assert sh.calls == 2
    assert sh.ops["shard_exchange"] == fmt.OpCounters(40, 160)
    assert sh.ops["shard_resolve"] == fmt.OpCounters(50, 500)
    assert sh.ops["path"] == fmt.OpCounters(150, 660)
    for op in ("all_gather", "gather", "broadcast"):  # nothing of a sharded call is counted under other names
        assert sh.ops[op] == fmt.OpCounters(0, 0)
    h = reader.header()
    assert (h.topp_rows, h.topp_fallback_rows) == (5, 3)
    assert fmt.MODE_OPS[Mode.SHARDED] == ("shard_exchange", "shard_resolve")


def test_split_recording_of_a_sharded_call_matches_the_one_pass_record(tmp_path):
    """CUDA path (count at call time, record_timed later) and CPU path (record) give the same counters."""
    one, split = make_recorder(tmp_path, name="one"), make_recorder(tmp_path, name="split")
    t0 = 1_000_000
    marks = CallMarks(1, Mode.SHARDED, 8, 0, 96, t0, t0 + 10, t0 + 30, t0 + 40, t0 + 90, t0, t0 + 35, t0 + 100,
                       resolve_nbytes=500, topp_rows=5, fallback_rows=3)
    one.record(marks)
    split.count(marks)
    split.record_timed(marks)
    a, b = RingReader(one.path), RingReader(split.path)
    assert a.header().counters == b.header().counters
    assert (b.header().topp_rows, b.header().topp_fallback_rows) == (5, 3)
    (ra,), _ = a.read_new()
    (rb,), _ = b.read_new()
    assert (rb.second_op, rb.fallback_rows) == (ra.second_op, ra.fallback_rows) == ("shard_resolve", 3)
