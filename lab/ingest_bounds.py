"""What a sidecar pays next to a full ring and next to many leftover engine directories.

    python -m lab.ingest_bounds [--capacity 1048576] [--dirs 1000] [--out out/ingest_bounds]

1. attach: a single-rank ring of --capacity records, full, then a fresh process (one per variant, so its peak
   RSS is its own) builds an Ingest and runs its first poll (discover, attach, read). Variants side by side:
   `capped` (sidecar.max_records_per_poll, default 16384: a new engine is read from at most that far back) and
   `uncapped` (max_records_per_poll = capacity: the whole ring in one poll, what the sidecar did before).
   Reported: wall and CPU seconds of that poll, records read, peak RSS (VmHWM) of the process.
2. discovery: --dirs leftover engine directories next to no live engine; CPU per discovery (after the first),
   for directories without liveness locks (kept: nothing says their engine is gone) and for directories of
   dead engines (lock files, none held: removed by the first discovery).
Writes results.json and ingest_bounds.png.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

from gatherwise.bench.figures import pyplot, save
from gatherwise.engine_hooks.call_marks import CallMarks
from gatherwise.engine_hooks.recorder import RingRecorder
from gatherwise.shm_format.liveness import LivenessLock, is_engine_dir_name
from gatherwise.shm_format.ring import engine_dir, ring_path


def _peak_rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _fill(rec: RingRecorder, n: int) -> None:
    t = time.perf_counter_ns()
    for i in range(n):
        rec.record(CallMarks(i, i % 2, 1 + i % 64, 0, 4096, t, t + 5, t + 400, 0, 0, t + 400, t + 500, t + 510))


def _attach_once(shm: str, cap: int, out: mp.Queue) -> None:
    from gatherwise.sidecar.ingest.hooks_off import HooksOffWatch
    from gatherwise.sidecar.ingest.poll import Ingest
    from gatherwise.sidecar.metrics.record_histograms import RecordHistograms

    ingest = Ingest(shm, RecordHistograms(), HooksOffWatch(shm, remove_dead=False), max_records_per_poll=cap,
                    remove_dead_dirs=False)
    w0, c0 = time.perf_counter(), time.process_time()
    read = ingest.poll_once().records
    out.put({"wall_s": time.perf_counter() - w0, "cpu_s": time.process_time() - c0, "records": read,
             "peak_rss_mib": _peak_rss_kib() / 1024})


def attach(shm: str, capacity: int) -> dict:
    engine_id = 0x5EED
    os.makedirs(engine_dir(shm, engine_id), mode=0o700)
    rec = RingRecorder(ring_path(shm, engine_id, 0), engine_id=engine_id, rank=0, tp_size=1, vocab=32000,
                       dtype="float32", capacity=capacity)
    _fill(rec, capacity + capacity // 8)  # full, and lapped once
    ctx = mp.get_context("spawn")
    results = {}
    for name, cap in (("capped", 16384), ("uncapped", capacity)):
        queue = ctx.Queue()
        proc = ctx.Process(target=_attach_once, args=(shm, cap, queue))
        proc.start()
        results[name] = queue.get(timeout=3600)
        proc.join()
    rec.close(unlink=True)
    return results


def _leftovers(shm: str, n: int, with_locks: bool) -> None:
    for i in range(n):
        engine_id = 0x1000 + i
        directory = engine_dir(shm, engine_id)
        os.makedirs(directory, mode=0o700)
        lock = LivenessLock(directory, 0) if with_locks else None
        rec = RingRecorder(ring_path(shm, engine_id, 0), engine_id=engine_id, rank=0, tp_size=2, vocab=100,
                           dtype="float32", capacity=16)
        rec.close()
        if lock is not None:
            lock.close()  # as if its process had died


def discovery(root: str, n: int, repeats: int = 40) -> dict:
    from gatherwise.sidecar.ingest.hooks_off import HooksOffWatch
    from gatherwise.sidecar.ingest.poll import Ingest
    from gatherwise.sidecar.metrics.record_histograms import RecordHistograms

    out = {}
    for name, with_locks in (("no_locks_kept", False), ("dead_removed", True)):
        shm = tempfile.mkdtemp(dir=root, prefix=f"{name}-")
        _leftovers(shm, n, with_locks)
        ingest = Ingest(shm, RecordHistograms(), HooksOffWatch(shm), discover_interval=0.0)
        c0 = time.process_time()
        ingest.poll_once()
        first = time.process_time() - c0
        c0 = time.process_time()
        for _ in range(repeats):
            ingest.poll_once()
        per = (time.process_time() - c0) / repeats
        left = sum(map(is_engine_dir_name, os.listdir(shm)))
        out[name] = {"first_discovery_cpu_ms": first * 1e3, "discovery_cpu_ms": per * 1e3,
                     "core_share_at_2hz": per / 0.5, "dirs_left": left}
        shutil.rmtree(shm)
    return out


def plot(path: Path, result: dict) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    names = list(result["attach"])
    axes[0].bar(names, [result["attach"][n]["wall_s"] for n in names], color=["tab:green", "tab:red"])
    axes[0].set_ylabel("first poll, wall seconds")
    axes[0].set_title(f"attach next to a full ring of {result['capacity']} records")
    axes[1].bar(names, [result["attach"][n]["peak_rss_mib"] for n in names], color=["tab:green", "tab:red"])
    axes[1].set_ylabel("peak RSS of the process, MiB")
    axes[1].set_title("memory")
    kinds = list(result["discovery"])
    axes[2].bar(kinds, [result["discovery"][k]["discovery_cpu_ms"] for k in kinds], color="tab:blue")
    axes[2].set_ylabel("CPU ms per discovery (every 0.5 s)")
    axes[2].set_title(f"{result['dirs']} leftover engine directories")
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.ingest_bounds", description=__doc__.split("\n\n")[0])
    p.add_argument("--capacity", type=int, default=1 << 20)
    p.add_argument("--dirs", type=int, default=1000)
    p.add_argument("--out", type=Path, default=Path("out/ingest_bounds"))
    args = p.parse_args(argv)
    root = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    shm = tempfile.mkdtemp(dir=root, prefix="gatherwise-bench-bounds-")
    try:
        result = {"capacity": args.capacity, "dirs": args.dirs, "machine": platform.platform(),
                  "cpus": os.cpu_count(), "load_before": os.getloadavg(),
                  "attach": attach(os.path.join(shm, "attach"), args.capacity),
                  "discovery": discovery(shm, args.dirs), "load_after": os.getloadavg()}
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=2))
    plot(args.out / "ingest_bounds.png", result)
    a = result["attach"]
    print(f"attach, full ring of {args.capacity}: capped {a['capped']['wall_s']:.2f} s / "
          f"{a['capped']['peak_rss_mib']:.0f} MiB ({a['capped']['records']} records), uncapped "
          f"{a['uncapped']['wall_s']:.2f} s / {a['uncapped']['peak_rss_mib']:.0f} MiB "
          f"({a['uncapped']['records']} records): {a['uncapped']['wall_s'] / a['capped']['wall_s']:.0f}x time")
    for kind, d in result["discovery"].items():
        print(f"discovery, {args.dirs} dirs {kind}: {d['discovery_cpu_ms']:.2f} ms CPU each "
              f"({d['core_share_at_2hz']:.1%} of a core at 2 Hz), first {d['first_discovery_cpu_ms']:.0f} ms, "
              f"{d['dirs_left']} left")
    print(f"wrote {args.out}/results.json and ingest_bounds.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
