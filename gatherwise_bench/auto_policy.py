"""Auto policy vs static modes on a mixed workload that crosses the gather/all_gather crossover (TP=2, gloo).

    .venv/bin/python -m gatherwise_bench.auto_policy [--rounds 4] [--segment 4] [--cold 90] [--out out/auto_policy]

One real TP=2 engine (install_hooks: rings + control block) and one real sidecar subprocess. Phase 1 interleaves
segments of static all_gather, static gather and auto (PUT /v1/mode) in rotating order, so slow drifts of this
shared machine hit every variant alike; auto there is *warm*: its estimates include the static segments'
samples. Phase 2 starts a fresh engine instance (fresh policy state) and runs auto *cold* for --cold seconds,
probes and learning included (auto_cold), and reports its last third separately (auto_cold_tail). The cost of
a call is its cross-rank critical path from the ring records; a variant's total is the sum over batch sizes
of (calls of that size in the workload) x (its 5%-trimmed mean cost at that size), so every variant is charged for the
same workload. The oracle takes, per size, the faster static mode.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import defaultdict
from http import HTTPStatus
from pathlib import Path

import httpx
import yaml

from gatherwise.modes import IMPLEMENTED, Mode
from gatherwise.shm_format.ring import engine_dir_name
from gatherwise_bench.bench_sidecar import auth_header, start_sidecar
from gatherwise_bench.figures import pyplot, save
from gatherwise_bench.sidecar_cpu import cpu_seconds

STATIC = tuple(m.label for m in IMPLEMENTED)  # every implemented mode is a static variant

SIZES = (1, 2, 4, 8, 16, 32)
CALLS_PER_SIZE = 8
VOCAB = 32000
TP = 2
# The config defaults except a shorter probe interval and sample age, so a run of minutes learns and re-learns.
POLICY = {"margin": 0.05, "min_samples": 20, "window": 128, "dwell_seconds": 5.0, "probe_interval_seconds": 3.0,
          "probe_calls": 8, "probe_budget": 0.02, "max_sample_age_seconds": 60.0}


def engine_rank(rank: int, world: int, config_path: str, stop_file: str) -> int:
    import torch

    from engine_hooks.comm import default_communicator
    from engine_hooks.install import install_hooks
    from engine_hooks.sampling import SamplingParams, SamplingRow
    from gatherwise.config import load_config

    comm = default_communicator()
    hooks = install_hooks(comm, vocab=VOCAB, config=load_config(config_path))
    path = hooks.path
    gen = torch.Generator().manual_seed(rank)
    logits = {b: torch.randn(b, path.width, generator=gen) for b in SIZES}
    rows = {b: [SamplingRow(SamplingParams(), r, 0) for r in range(b)] for b in SIZES}
    flag = torch.zeros(1, dtype=torch.int64)
    try:
        while True:
            for b in SIZES:
                for _ in range(CALLS_PER_SIZE):
                    path.logits_buffer(b).copy_(logits[b])
                    path.run(rows[b])
            if rank == 0:
                flag.fill_(int(os.path.exists(stop_file)))
            comm.broadcast(flag)
            if flag.item():
                return path.call_index
    finally:
        hooks.close()


class Engine:
    """The TP=2 engine in a thread (gatherwise_bench.launch.run_ranks blocks), plus readers of its rings."""

    def __init__(self, config_path: str, shm: str, stop_file: str) -> None:
        from gatherwise_bench.launch import run_ranks

        self.stop_file = stop_file
        known = {e.engine_id for e in _engines(shm)}
        self.thread = threading.Thread(target=run_ranks, args=(engine_rank, TP, config_path, stop_file), daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 120
        while True:
            fresh = [e for e in _engines(shm) if e.engine_id not in known and len(e.rings) == TP]
            if fresh:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("engine did not start")
            time.sleep(0.2)
        time.sleep(0.5)
        from sidecar.ring_reader import RingReader

        self.engine_id = fresh[0].engine_id
        self.readers = [RingReader(p) for p in fresh[0].rings.values()]
        self.by_call: dict[int, dict[int, object]] = defaultdict(dict)

    def drain(self) -> None:
        for rank, reader in enumerate(self.readers):
            records, missed = reader.read_new()
            if missed:
                print(f"warning: {missed} records missed on rank {rank}", file=sys.stderr)
            for rec in records:
                self.by_call[rec.call_index][rank] = rec

    def stop(self) -> None:
        Path(self.stop_file).touch()
        while self.thread.is_alive():
            self.drain()
            self.thread.join(0.2)
        self.drain()

    def calls(self) -> list[tuple[int, int, int, float]]:
        """(call_index, rows, mode, critical-path seconds) of every call both ranks recorded."""
        out = []
        for ci, recs in sorted(self.by_call.items()):
            if len(recs) == TP:  # every rank recorded the call
                r = list(recs.values())
                out.append((ci, r[0].rows, r[0].mode, (max(x.end_ns for x in r) - max(x.start_ns for x in r)) * 1e-9))
        return out


def _engines(shm: str):
    from sidecar.ring_reader import discover_engines

    try:
        return discover_engines(shm)
    except OSError:
        return []


def put_mode(url: str, mode: str) -> int:
    r = httpx.put(f"{url}/v1/mode", json={"mode": mode}, params={"wait": 60},
                  headers=auth_header(), timeout=90)
    if r.status_code != HTTPStatus.OK:
        raise RuntimeError(f"PUT /v1/mode {mode}: {r.status_code} {r.text}")
    return int(r.json()["apply_call"])


def current_call(url: str) -> int:
    return int(httpx.get(f"{url}/v1/mode", timeout=10).json()["call_index"])


def drain_for(engine: Engine, seconds: float) -> None:
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        engine.drain()
        time.sleep(0.2)


def wait_attached(url: str, engine_id: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        r = httpx.get(f"{url}/v1/mode", timeout=10)
        if r.status_code == HTTPStatus.OK and r.json()["engine"] == engine_dir_name(engine_id):
            return
        time.sleep(0.2)
    raise RuntimeError("sidecar did not attach the engine")


def segment_costs(calls, segments) -> dict[str, dict[int, list[float]]]:
    """variant -> rows -> critical paths of the calls in that variant's (variant, first call, end call) segments."""
    out: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for variant, start, stop in segments:
        for ci, rows, _mode, cost in calls:
            if start <= ci < stop:
                out[variant][rows].append(cost)
    return out


def by_actual_mode(calls, segments) -> dict[str, dict[str, dict[str, float]]]:
    """variant -> "rows/mode" -> {calls, trimmed mean}: what each variant's calls really ran (auto: probes show
    up as calls in the mode the policy did not choose)."""
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for variant, start, stop in segments:
        for ci, rows, mode, cost in calls:
            if start <= ci < stop:
                out[variant][f"{rows}/{Mode(mode).label}"].append(cost)
    return {v: {k: {"calls": len(c), "mean_seconds": trimmed_mean(c)} for k, c in sorted(per.items())}
            for v, per in out.items()}


def trimmed_mean(values: list[float], trim: float = 0.05) -> float:
    """Mean without the top and bottom `trim` share: a 2-core shared host deschedules a rank now and then for
    hundreds of ms, which says nothing about the mode but would dominate a plain mean."""
    ordered = sorted(values)
    k = int(len(ordered) * trim)
    kept = ordered[k: len(ordered) - k] or ordered
    return sum(kept) / len(kept)


def summarize(costs: dict[str, dict[int, list[float]]]) -> dict:
    mean = {v: {b: trimmed_mean(c) for b, c in per.items() if c} for v, per in costs.items()}
    oracle = {b: min(mean[m][b] for m in STATIC) for b in SIZES}
    mean["oracle"] = oracle
    totals = {v: CALLS_PER_SIZE * sum(m[b] for b in SIZES) for v, m in mean.items() if all(b in m for b in SIZES)}
    return {"mean_seconds": {v: {str(b): s for b, s in m.items()} for v, m in mean.items()},
            "samples": {v: {str(b): len(c) for b, c in per.items()} for v, per in costs.items()},
            "total_seconds_per_cycle": totals,
            "ratio_to_oracle": {v: t / totals["oracle"] for v, t in totals.items()}}


def plot(path: Path, result: dict) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    ratios = result["ratio_to_oracle"]
    names = list(ratios)
    left.bar(names, [ratios[n] for n in names], color=[f"C{i}" for i in range(len(names))])
    left.axhline(1.03, color="grey", ls="--", lw=1, label="1.03x oracle")
    left.set_ylabel("total logits-path time / oracle")
    left.tick_params(axis="x", rotation=30)
    left.set_title("mixed workload, TP=2 gloo, V=32000 f32")
    left.legend()
    for name in (*STATIC, "auto_warm", "auto_cold_tail"):
        m = result["mean_seconds"].get(name)
        if m:
            right.plot(SIZES, [m[str(b)] * 1e3 for b in SIZES], marker="o", label=name)
    right.set_xscale("log", base=2)
    right.set_xlabel("batch size (rows)")
    right.set_ylabel("mean critical path (ms)")
    right.legend()
    save(fig, path)


def run(rounds: int, segment: float, settle: float, cold: float, workdir: str, gather_delay: float = 0.0) -> dict:
    shm = os.path.join(workdir, "shm")
    os.makedirs(shm)
    config = os.path.join(workdir, "gatherwise.yaml")
    Path(config).write_text(yaml.safe_dump({
        "engine": {"shm_dir": shm, "initial_mode": "all_gather"}, "telemetry": {"ring_capacity": 1 << 17},
        # optional: a fixed extra latency on every gather, like a link with a higher per-message cost
        "control": {"inject_delay": [{"after_seconds": 0, "mode": "gather", "seconds": gather_delay}]
                    if gather_delay else []},
        "sidecar": {"poll_interval_seconds": 0.01}, "traces": {"enabled": False},
        "policy": {"mode": "manual", **POLICY}}))
    sidecar, url = start_sidecar(config)
    try:
        variants = [*STATIC, "auto"]
        engine = Engine(config, shm, os.path.join(workdir, "stop1"))
        wait_attached(url, engine.engine_id)
        segments, previous = [], None
        sidecar_cpu: dict[str, list[float]] = {}  # variant -> [sidecar CPU seconds, wall seconds] while measured
        for r in range(rounds):
            for variant in variants[r % len(variants):] + variants[: r % len(variants)]:
                applied = put_mode(url, variant)
                if previous is not None:
                    segments.append((*previous, applied))
                # every variant drops its first `settle` seconds: the switch-over (and, for auto, the dwell the
                # previous manual flip imposes) is a cost of this benchmark's schedule, not of the variant
                drain_for(engine, settle)
                previous = ("auto_warm" if variant == "auto" else variant, current_call(url))
                c0, t0 = cpu_seconds(sidecar.pid), time.monotonic()
                drain_for(engine, segment - settle)
                cpu = sidecar_cpu.setdefault(previous[0], [0.0, 0.0])
                cpu[0] += cpu_seconds(sidecar.pid) - c0
                cpu[1] += time.monotonic() - t0
        engine.stop()
        calls = engine.calls()
        segments.append((*previous, calls[-1][0] + 1))
        costs = segment_costs(calls, segments)
        actual = by_actual_mode(calls, segments)
        decisions_warm = httpx.get(f"{url}/v1/decisions", params={"limit": 256}).json()["decisions"]
        cold_engine = Engine(config, shm, os.path.join(workdir, "stop2"))
        wait_attached(url, cold_engine.engine_id)
        start = put_mode(url, "auto")
        c0, t0 = cpu_seconds(sidecar.pid), time.monotonic()
        drain_for(cold_engine, cold)
        sidecar_cpu["auto_cold"] = [cpu_seconds(sidecar.pid) - c0, time.monotonic() - t0]
        stats = httpx.get(f"{url}/v1/stats").json()
        learned = httpx.get(f"{url}/v1/policy/table").json()
        cold_engine.stop()
        cold_calls = cold_engine.calls()
        end = cold_calls[-1][0] + 1
        costs.update(segment_costs(cold_calls, [("auto_cold", start, end)]))
        actual.update(by_actual_mode(cold_calls, [("auto_cold", start, end)]))
        # the last third of the cold run: what auto costs once it has learned (probes still included)
        costs.update(segment_costs(cold_calls, [("auto_cold_tail", start + 2 * (end - start) // 3, end)]))
    finally:
        sidecar.terminate()
        sidecar.wait(30)
    result = summarize(costs)
    result.update(config={"sizes": SIZES, "calls_per_size": CALLS_PER_SIZE, "vocab": VOCAB, "dtype": "float32",
                          "tp": 2, "rounds": rounds, "segment_seconds": segment, "settle_seconds": settle,
                          "cold_seconds": cold, "statistic": "5% trimmed mean of the critical path",
                          "injected_gather_delay_seconds": gather_delay,
                          "policy": POLICY},
                  by_actual_mode=actual, cold_probe_share=stats["probe_share"], cold_learned_table=learned["table"],
                  warm_auto_decisions=len([d for d in decisions_warm if d["reason"] == "auto"]),
                  sidecar_core_percent={v: 100.0 * c / w for v, (c, w) in sidecar_cpu.items() if w > 0},
                  load_average=os.getloadavg())
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gatherwise_bench.auto_policy", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds of the three variants")
    p.add_argument("--segment", type=float, default=10.0, help="seconds per variant segment")
    p.add_argument("--settle", type=float, default=3.0, help="seconds at the start of every segment not measured")
    p.add_argument("--cold", type=float, default=90.0, help="seconds of the cold-start auto run")
    p.add_argument("--gather-delay", type=float, default=0.0,
                   help="seconds added to every gather (control.inject_delay), to give this machine a crossover")
    p.add_argument("--out", default="out/auto_policy", help="directory for auto_policy.json and .png")
    args = p.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="gw-bench-auto-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        if not 0 <= args.settle < args.segment:
            p.error("--settle must be >= 0 and shorter than --segment")
        result = run(args.rounds, args.segment, args.settle, args.cold, workdir, args.gather_delay)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "auto_policy.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(out / "auto_policy.png", result)
    print(json.dumps({k: result[k] for k in ("ratio_to_oracle", "total_seconds_per_cycle", "cold_probe_share",
                                             "sidecar_core_percent")},
                     indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
