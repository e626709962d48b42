"""The ring header's counters through a real sidecar: per-op seconds and bytes, calls, and drops per reason are
exported exactly as the header holds them, and a restarted sidecar exports the same values (nothing counted
from its own start). The engine side is real RingRecorders in this process, recording some calls with their
timings and some the way the CUDA event resolver does when the device falls behind (counted, timings dropped)."""

from __future__ import annotations

import signal
from collections.abc import Iterable
from pathlib import Path

import pytest

from gatherwise.engine_hooks.call_marks import CallMarks
from gatherwise.engine_hooks.recorder import RingRecorder
from gatherwise.modes import Mode
from gatherwise.shm_format import ring as fmt
from gatherwise.sidecar.ingest.ring_reader import RingReader
from tests._sidecar import scrape, start_sidecar, total, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

ENGINE_ID = 0x5EC0
LABEL = fmt.engine_dir_name(ENGINE_ID)


def _write_calls(recorders: list[RingRecorder], first: int, n: int) -> None:
    for i in range(first, first + n):
        mode = Mode.GATHER if i % 3 else Mode.ALL_GATHER
        for rec in recorders:
            t = 10**9 + i * 100_000 + rec.rank * 1_000
            bcast = (t + 7_000, t + 9_000) if mode == Mode.GATHER else (0, 0)
            marks = CallMarks(i, mode, 4, 0, 4_096, t, t + 1_000, t + 5_000 + i, *bcast, t + 5_000 + i, t + 6_000,
                               t + 9_500)
            if i % 4 == 3:  # the device fell behind: counted now, timings given up
                rec.count(marks)
                rec.drop(fmt.DROP_TIMING_BACKLOG)
            elif i % 4 == 2:  # resolved later
                rec.count(marks)
                rec.record_timed(marks)
            else:
                rec.record(marks)


def _expected(shm: Path) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {}
    for rank in (0, 1):
        with RingReader(fmt.ring_path(shm, ENGINE_ID, rank)) as reader:
            h = reader.header()
        r = str(rank)
        for mode in (Mode.ALL_GATHER, Mode.GATHER):
            row = h.counters[mode]
            out[("gatherwise_calls_total", r, mode.label)] = row.calls
            out[("gatherwise_logits_path_bytes_total", r, mode.label)] = row.ops["path"].bytes
            for op in ("sample", "path") + (("all_gather",) if mode == Mode.ALL_GATHER else ("gather", "broadcast")):
                label = "logits_path" if op == "path" else op
                out[("gatherwise_op_seconds_total", r, mode.label, label)] = row.ops[op].ns / 1e9
        out[("gatherwise_records_dropped_total", r, "timing_backlog")] = h.drops["timing_backlog"]
    return out


def _exported(url: str, keys: Iterable[tuple[str, ...]]) -> dict[tuple[str, ...], float]:
    """The same keys as _expected, read from the sidecar's /metrics."""
    text = scrape(url)
    out = {}
    for key in keys:
        name, rank, *rest = key
        if name == "gatherwise_records_dropped_total":
            out[key] = total(text, name, engine=LABEL, rank=rank, reason=rest[0])
        elif name == "gatherwise_op_seconds_total":
            out[key] = total(text, name, engine=LABEL, rank=rank, mode=rest[0], op=rest[1])
        else:
            out[key] = total(text, name, engine=LABEL, rank=rank, mode=rest[0])
    return out


def test_header_counters_are_exported_exactly_and_survive_a_sidecar_restart(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    Path(fmt.engine_dir(shm, ENGINE_ID)).mkdir(parents=True)
    recorders = [RingRecorder(fmt.ring_path(shm, ENGINE_ID, r), engine_id=ENGINE_ID, rank=r, tp_size=2,
                              vocab=1000, dtype="float32", capacity=8) for r in (0, 1)]
    sidecars = []
    try:
        _write_calls(recorders, 0, 40)  # 40 calls into 8-slot rings: most records overwritten before any read
        expected = _expected(shm)
        assert expected[("gatherwise_records_dropped_total", "0", "timing_backlog")] == 10
        assert expected[("gatherwise_op_seconds_total", "1", "gather", "broadcast")] > 0
        first, url = start_sidecar(str(shm))
        sidecars.append(first)
        wait_for(lambda: _exported(url, expected) == expected, 30, "the header counters on /metrics")
        text = scrape(url)
        assert total(text, "gatherwise_records_dropped_total", engine=LABEL, rank="0", reason="torn") == 0

        first.popen.send_signal(signal.SIGKILL)
        assert first.popen.wait(10) == -signal.SIGKILL
        _write_calls(recorders, 40, 13)  # the engine goes on without a sidecar
        expected = _expected(shm)
        second, url = start_sidecar(str(shm))
        sidecars.append(second)
        # the header's values, not counts from this sidecar's start
        wait_for(lambda: _exported(url, expected) == expected, 30, "the same header counters after the restart")
    finally:
        for rec in recorders:
            rec.close()
        for proc in sidecars:
            if proc.popen.poll() is None:
                proc.stop()
