"""Sidecar ingest rate: how many ring records per second RingReader.read_new() turns into CallRecords on one core.

    python -m lab.ingest_rate [--records 200000] [--repeats 5] [--out out/ingest_rate]

1. drain: a ring (capacity 65536) is filled by a RingRecorder (not timed), then read back in batches of
   64, 512, 4096 and everything-at-once. Reported per batch size: records/s of wall time and of the reader's
   own CPU time (time.process_time: one core), median and best of --repeats.
2. live: a writer process records as fast as it can into a ring of 8192 while this process reads it in a
   loop for --seconds; reported: records ingested per second, records missed (overwritten before read).
Target: >= 200k records/s on one core. Writes results.json and ingest_rate.png.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gatherwise.bench.figures import pyplot, save
from gatherwise.engine_hooks.call_marks import CallMarks
from gatherwise.engine_hooks.recorder import RingRecorder
from gatherwise.sidecar.ingest.ring_reader import RingReader

if TYPE_CHECKING:
    from multiprocessing.synchronize import Event

BATCHES = (64, 512, 4096, 0)  # 0: everything available in one read_new()
TARGET = 200_000


def _fill(rec: RingRecorder, n: int, first_call: int = 0) -> None:
    for i in range(first_call, first_call + n):
        t0 = 1_000_000 + 1000 * i
        if i % 2:
            rec.record(CallMarks(i, 1, 1 + i % 64, 0, 4 * 32000, t0, t0 + 5, t0 + 400, t0 + 500, t0 + 600, t0 + 400,
                                   t0 + 500, t0 + 610))
        else:
            rec.record(CallMarks(i, 0, 1 + i % 64, 0, 8 * 32000, t0, t0 + 5, t0 + 400, 0, 0, t0 + 400, t0 + 500,
                                   t0 + 510))


def drain(shm: str, records: int, repeats: int) -> dict:
    capacity = 1 << 16
    records = min(records, capacity - 1)
    rec = RingRecorder(os.path.join(shm, "drain"), engine_id=1, rank=0, tp_size=2, vocab=32000, dtype="float32",
                       capacity=capacity)
    out = {}
    written = 0
    for batch in BATCHES:
        wall, cpu = [], []
        for _ in range(repeats):
            reader = RingReader(rec.path, start="now")
            _fill(rec, records, written)
            written += records
            got = 0
            w0, c0 = time.perf_counter(), time.process_time()
            while got < records:
                recs, missed = reader.read_new(max_records=batch or None)
                assert missed == 0 and recs, "the drain benchmark must not lose records"
                got += len(recs)
            w1, c1 = time.perf_counter(), time.process_time()
            reader.close()
            wall.append(got / (w1 - w0))
            cpu.append(got / max(c1 - c0, 1e-9))
        out[str(batch or "all")] = {"records": records, "wall_rps_median": statistics.median(wall),
                                    "wall_rps_best": max(wall), "cpu_rps_median": statistics.median(cpu),
                                    "wall_rps": wall, "cpu_rps": cpu}
    rec.close(unlink=True)
    return out


def _live_writer(path: str, seconds: float, ready: Event, stop: Event) -> None:
    rec = RingRecorder(path, engine_id=2, rank=0, tp_size=2, vocab=32000, dtype="float32", capacity=8192)
    ready.set()
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end and not stop.is_set():
        _fill(rec, 256, i)
        i += 256
    rec.close()


def live(shm: str, seconds: float) -> dict:
    path = os.path.join(shm, "live")
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_live_writer, args=(path, seconds, ready, stop))
    proc.start()
    try:
        if not ready.wait(60):
            raise TimeoutError("writer process did not start")
        reader = RingReader(path, start="now")
        got = missed = 0
        w0, c0 = time.perf_counter(), time.process_time()
        while proc.is_alive():
            recs, m = reader.read_new()
            got += len(recs)
            missed += m
        recs, m = reader.read_new()
        got, missed = got + len(recs), missed + m
        w1, c1 = time.perf_counter(), time.process_time()
        written = reader.header().write_index
        reader.close()
    finally:
        stop.set()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    return {"seconds": w1 - w0, "written": written, "ingested": got, "missed": missed,
            "ingested_per_s": got / (w1 - w0), "ingested_per_cpu_s": got / max(c1 - c0, 1e-9),
            "written_per_s": written / (w1 - w0)}


def plot(path: Path, result: dict) -> None:
    plt = pyplot()
    labels = list(result["drain"])
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], [result["drain"][k]["wall_rps_median"] / 1e3 for k in labels], width=0.4,
           label="wall (median)")
    ax.bar([x + 0.2 for x in xs], [result["drain"][k]["cpu_rps_median"] / 1e3 for k in labels], width=0.4,
           label="reader CPU (median)")
    ax.axhline(TARGET / 1e3, color="red", linestyle="--", linewidth=1, label="target 200k/s")
    ax.set_xticks(list(xs), [f"batch {k}" for k in labels])
    ax.set_ylabel("thousand records / s (one core)")
    live_rate = result["live"]["ingested_per_s"] / 1e3
    ax.set_title(f"RingReader.read_new() ingest rate; live writer: {live_rate:.0f}k/s ingested, "
                 f"{result['live']['missed']} missed", fontsize=9)
    ax.legend(fontsize=8)
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.ingest_rate", description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=60_000, help="records per drain repeat (max 65535)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0, help="duration of the live run")
    parser.add_argument("--out", type=Path, default=Path("out/ingest_rate"))
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as shm:
        result: dict[str, Any] = {"drain": drain(shm, args.records, args.repeats), "live": live(shm, args.seconds)}
    result.update(host=platform.node(), cpus=os.cpu_count(), python=platform.python_version(),
                  loadavg_before=load_before, loadavg_after=os.getloadavg(), target_rps=TARGET)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    plot(args.out / "ingest_rate.png", result)
    print(f"{'batch':>6} {'wall rec/s (median)':>20} {'best':>10} {'CPU rec/s (median)':>19}")
    for k, d in result["drain"].items():
        print(f"{k:>6} {d['wall_rps_median']:20,.0f} {d['wall_rps_best']:10,.0f} {d['cpu_rps_median']:19,.0f}")
    lv = result["live"]
    print(f"live: writer {lv['written_per_s']:,.0f} rec/s, reader ingested {lv['ingested_per_s']:,.0f} rec/s "
          f"({lv['ingested_per_cpu_s']:,.0f} per CPU-s), missed {lv['missed']} of {lv['written']}")
    print(f"load average before/after: {load_before[0]:.1f} / {result['loadavg_after'][0]:.1f}")
    print(f"wrote {args.out / 'results.json'} and {args.out / 'ingest_rate.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
