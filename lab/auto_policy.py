"""Auto policy vs static modes on a mixed workload that crosses the gather/all_gather crossover (TP=2, gloo).

    .venv/bin/python -m lab.auto_policy [--rounds 4] [--segment 4] [--cold 90] [--out out/auto_policy]
    .venv/bin/python -m lab.auto_policy --workload slow [--greedy-share 0.8] [--out out/auto_slow]

Two workloads. `fast`: greedy calls back to back at six batch sizes, vocab 32 000 (about 100 calls/s), with a
policy tuned for minutes-long runs. `slow`: what a CPU serving engine looks like to the policy — two batch sizes,
a call every 0.25 s plus the call itself (a few calls per second), greedy and top-p calls mixed (`--greedy-share`
of each size's calls greedy), vocab 151 936, the config's default policy parameters — where which mode wins
depends on the mix; the report adds the calls and seconds from `PUT /v1/mode auto` to each of its decisions.

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
from typing import TYPE_CHECKING

import httpx
import yaml

from gatherwise.bench.bench_sidecar import auth_header, start_sidecar
from gatherwise.bench.figures import pyplot, save
from gatherwise.call_kind import kind_label, split_tag
from gatherwise.config import PolicyParams
from gatherwise.modes import IMPLEMENTED, Mode, bucket_label, bucket_of
from gatherwise.shm_format.ring import engine_dir_name
from lab.sidecar_cpu import cpu_seconds

if TYPE_CHECKING:
    from gatherwise.shm_format.ring import CallRecord
    from gatherwise.sidecar.ingest.ring_reader import EngineFiles

# (call_index, rows, mode, critical-path seconds, kind, unix seconds at its start) of one call both ranks recorded
Call = tuple[int, int, int, float, int, float]
Segment = tuple[str, int, int]  # (variant, first call, end call)

STATIC = tuple(m.label for m in IMPLEMENTED)  # every implemented mode is a static variant

TP = 2
# The config defaults except a shorter probe interval and sample age, so a run of minutes learns and re-learns.
POLICY = {"margin": 0.05, "min_samples": 20, "window": 128, "dwell_seconds": 5.0, "probe_interval_seconds": 3.0,
          "probe_calls": 8, "probe_budget": 0.02, "max_sample_age_seconds": 60.0}


def workload(name: str, greedy_share: float = 1.0) -> dict:
    """One cycle of the engine's calls: (rows, top-p?) per call in order, the vocab, the pause after each call
    (the rest of a decode step), and the policy parameters of the run."""
    if name == "fast":
        calls = [(b, False) for b in (1, 2, 4, 8, 16, 32) for _ in range(8)]
        return {"name": name, "calls": calls, "vocab": 32000, "gap_seconds": 0.0, "policy": POLICY}
    greedy = round(10 * greedy_share)
    calls = [(b, i >= greedy) for b in (8, 32) for i in range(10)]
    return {"name": name, "greedy_share": greedy_share, "calls": calls, "vocab": 151936, "gap_seconds": 0.25,
            "policy": PolicyParams().model_dump()}


def engine_rank(rank: int, world: int, config_path: str, stop_file: str, load: dict) -> int:
    import torch

    from gatherwise.config import load_config
    from gatherwise.engine_hooks.comm import default_communicator
    from gatherwise.engine_hooks.install import install_hooks
    from gatherwise.engine_hooks.sampling import SamplingParams, SamplingRow

    comm = default_communicator()
    hooks = install_hooks(comm, vocab=load["vocab"], config=load_config(config_path))
    path = hooks.logits_path
    gen = torch.Generator().manual_seed(rank)
    sizes = sorted({b for b, _ in load["calls"]})
    logits = {b: torch.randn(b, path.width, generator=gen) for b in sizes}
    top_p = SamplingParams(temperature=0.8, top_p=0.9, seed=7)
    rows = {(b, sampled): [SamplingRow(top_p if sampled else SamplingParams(), r, 0) for r in range(b)]
            for b in sizes for sampled in (False, True)}
    flag = torch.zeros(1, dtype=torch.int64)
    try:
        while True:
            for b, sampled in load["calls"]:
                path.logits_buffer(b).copy_(logits[b])
                path.run(rows[(b, sampled)])
                if load["gap_seconds"]:
                    time.sleep(load["gap_seconds"])
            if rank == 0:
                flag.fill_(int(os.path.exists(stop_file)))
            comm.broadcast(flag)
            if flag.item():
                return path.call_index
    finally:
        hooks.close()


class Engine:
    """The TP=2 engine in a thread (gatherwise.bench.launch.run_ranks blocks), plus readers of its rings."""

    def __init__(self, config_path: str, shm: str, stop_file: str, load: dict) -> None:
        from gatherwise.bench.launch import run_ranks

        self.stop_file = stop_file
        known = {e.engine_id for e in _engines(shm)}
        self.thread = threading.Thread(target=run_ranks, args=(engine_rank, TP, config_path, stop_file, load),
                                       daemon=True)
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
        from gatherwise.sidecar.ingest.ring_reader import RingReader

        self.engine_id = fresh[0].engine_id
        self.readers = [RingReader(p) for p in fresh[0].rings.values()]
        self.by_call: dict[int, dict[int, CallRecord]] = defaultdict(dict)

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

    def calls(self) -> list[Call]:
        """(call_index, rows, mode, critical-path seconds, kind, unix seconds at its start) of every call both
        ranks recorded."""
        header = self.readers[0].header()
        out = []
        for ci, recs in sorted(self.by_call.items()):
            if len(recs) == TP:  # every rank recorded the call
                r = list(recs.values())
                start = max(x.start_ns for x in r)
                out.append((ci, r[0].rows, r[0].mode, (max(x.end_ns for x in r) - start) * 1e-9,
                            split_tag(r[0].tag)[0], header.mono_to_wall_ns(start) * 1e-9))
        return out


def _engines(shm: str) -> list[EngineFiles]:
    from gatherwise.sidecar.ingest.ring_reader import discover_engines

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


def call_key(rows: int, kind: int) -> str:
    return f"{rows}/{kind_label(kind)}"


def segment_costs(calls: list[Call], segments: list[Segment]) -> dict[str, dict[str, list[float]]]:
    """variant -> "rows/kind" -> critical paths of the calls in that variant's (variant, first call, end call)
    segments."""
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for variant, start, stop in segments:
        for ci, rows, _mode, cost, kind, _t in calls:
            if start <= ci < stop:
                out[variant][call_key(rows, kind)].append(cost)
    return out


def by_actual_mode(calls: list[Call], segments: list[Segment]) -> dict[str, dict[str, dict[str, float]]]:
    """variant -> "rows/mode" -> {calls, trimmed mean}: what each variant's calls really ran (auto: probes show
    up as calls in the mode the policy did not choose)."""
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for variant, start, stop in segments:
        for ci, rows, mode, cost, kind, _t in calls:
            if start <= ci < stop:
                out[variant][f"{call_key(rows, kind)}/{Mode(mode).label}"].append(cost)
    return {v: {k: {"calls": len(c), "mean_seconds": trimmed_mean(c)} for k, c in sorted(per.items())}
            for v, per in out.items()}


def trimmed_mean(values: list[float], trim: float = 0.05) -> float:
    """Mean without the top and bottom `trim` share: a 2-core shared host deschedules a rank now and then for
    hundreds of ms, which says nothing about the mode but would dominate a plain mean."""
    ordered = sorted(values)
    k = int(len(ordered) * trim)
    kept = ordered[k: len(ordered) - k] or ordered
    return sum(kept) / len(kept)


def cycle_counts(load: dict) -> dict[str, int]:
    """"rows/kind" -> calls per workload cycle (the kinds as the engine records them)."""
    from gatherwise.call_kind import Sampling, call_kind

    kinds = {False: call_kind(Sampling.GREEDY), True: call_kind(Sampling.TOP_P)}
    counts: dict[str, int] = defaultdict(int)
    for rows, sampled in load["calls"]:
        counts[call_key(rows, kinds[sampled])] += 1
    return dict(counts)


def summarize(costs: dict[str, dict[str, list[float]]], load: dict) -> dict:
    """Every variant charged for the same workload: per bucket, the sum over its call keys of (calls per cycle) x
    (the variant's trimmed mean there). The oracle is, per bucket, the best static mode for that bucket's mix
    (a table has one mode per bucket); auto's ratio to it is what the policy achieved."""
    counts = cycle_counts(load)
    mean = {v: {k: trimmed_mean(c) for k, c in per.items() if c} for v, per in costs.items()}
    buckets: dict[str, list[str]] = defaultdict(list)
    for key in counts:
        buckets[bucket_label(bucket_of(int(key.split("/")[0])))].append(key)

    def bucket_total(m: dict[str, float], keys: list[str]) -> float | None:
        return sum(counts[k] * m[k] for k in keys) if all(k in m for k in keys) else None

    per_bucket = {v: {b: t for b, keys in buckets.items() if (t := bucket_total(m, keys)) is not None}
                  for v, m in mean.items()}
    oracle = {b: min(per_bucket[m][b] for m in STATIC) for b in buckets}
    per_bucket["oracle"] = oracle
    def best_static(b: str) -> str:
        return min(STATIC, key=lambda m: per_bucket[m][b])

    best = {b: best_static(b) for b in buckets}
    totals = {v: sum(t.values()) for v, t in per_bucket.items() if len(t) == len(buckets)}
    return {"mean_seconds": mean, "samples": {v: {k: len(c) for k, c in per.items()} for v, per in costs.items()},
            "calls_per_cycle": counts, "seconds_per_cycle_by_bucket": per_bucket, "best_static_by_bucket": best,
            "total_seconds_per_cycle": totals,
            "ratio_to_oracle": {v: t / totals["oracle"] for v, t in totals.items()}}


def decision_timeline(decisions: list[dict], calls: list[Call], start_call: int, auto_wall: float) -> list[dict]:
    """Each auto decision of the cold run: its bucket and mode, seconds since `PUT /v1/mode auto`, and how many
    calls of that bucket had started by then."""
    out = []
    for d in decisions:
        if d["reason"] != "auto" or d["time"] < auto_wall:
            continue
        bucket = d["buckets"][0]
        seen = sum(1 for ci, rows, _m, _c, _k, t in calls
                   if ci >= start_call and t < d["time"] and bucket_label(bucket_of(rows)) == bucket)
        paired = d["evidence"].get("paired", {}).get(d["mode"], {})
        out.append({"bucket": bucket, "mode": d["mode"], "previous": d["previous"][bucket],
                    "seconds_after_auto": round(d["time"] - auto_wall, 2), "bucket_calls_after_auto": seen,
                    "ratio": paired.get("ratio"), "kinds": paired.get("kinds"), "mix": d["evidence"].get("mix")})
    return out


def plot(path: Path, result: dict) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    ratios = result["ratio_to_oracle"]
    names = list(ratios)
    left.bar(names, [ratios[n] for n in names], color=[f"C{i}" for i in range(len(names))])
    left.axhline(1.03, color="grey", ls="--", lw=1, label="1.03x oracle")
    left.set_ylabel("total logits-path time / oracle")
    left.tick_params(axis="x", rotation=30)
    load = result["config"]
    left.set_title(f"{load['workload']} workload, TP=2 gloo, V={load['vocab']} f32")
    left.legend()
    keys = list(result["calls_per_cycle"])
    for name in (*STATIC, "auto_warm", "auto_cold_tail"):
        m = result["mean_seconds"].get(name)
        if m:
            right.plot(range(len(keys)), [m.get(k, float("nan")) * 1e3 for k in keys], marker="o", label=name)
    right.set_xticks(range(len(keys)), keys, rotation=30)
    right.set_xlabel("rows / call kind")
    right.set_ylabel("mean critical path (ms)")
    right.set_yscale("log")
    right.legend()
    save(fig, path)


def run(rounds: int, segment: float, settle: float, cold: float, workdir: str, gather_delay: float = 0.0,
        load: dict | None = None) -> dict:
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, not {rounds}")
    load = load or workload("fast")
    shm = os.path.join(workdir, "shm")
    os.makedirs(shm)
    config = os.path.join(workdir, "gatherwise.yaml")
    Path(config).write_text(yaml.safe_dump({
        "engine": {"shm_dir": shm, "initial_mode": "all_gather"}, "telemetry": {"ring_capacity": 1 << 17},
        # optional: a fixed extra latency on every gather, like a link with a higher per-message cost
        "control": {"inject_delay": [{"after_seconds": 0, "mode": "gather", "seconds": gather_delay}]
                    if gather_delay else []},
        "sidecar": {"poll_interval_seconds": 0.01}, "traces": {"enabled": False},
        "policy": {"mode": "manual", **load["policy"]}}))
    sidecar, url = start_sidecar(config)
    try:
        variants = [*STATIC, "auto"]
        engine = Engine(config, shm, os.path.join(workdir, "stop1"), load)
        wait_attached(url, engine.engine_id)
        segments: list[Segment] = []
        previous: tuple[str, int] | None = None  # (variant, first call) of the segment being measured
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
        assert previous is not None  # rounds >= 1 (checked above): the loop measured a segment
        segments.append((*previous, calls[-1][0] + 1))
        costs = segment_costs(calls, segments)
        actual = by_actual_mode(calls, segments)
        decisions_warm = httpx.get(f"{url}/v1/decisions", params={"limit": 256}).json()["decisions"]
        cold_engine = Engine(config, shm, os.path.join(workdir, "stop2"), load)
        wait_attached(url, cold_engine.engine_id)
        auto_wall = time.time()
        start = put_mode(url, "auto")
        c0, t0 = cpu_seconds(sidecar.pid), time.monotonic()
        drain_for(cold_engine, cold)
        sidecar_cpu["auto_cold"] = [cpu_seconds(sidecar.pid) - c0, time.monotonic() - t0]
        stats = httpx.get(f"{url}/v1/stats").json()
        learned = httpx.get(f"{url}/v1/policy/table").json()
        decisions_cold = httpx.get(f"{url}/v1/decisions", params={"limit": 256}).json()["decisions"]
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
    result = summarize(costs, load)
    result.update(config={"workload": load["name"], "greedy_share": load.get("greedy_share", 1.0),
                          "vocab": load["vocab"], "gap_seconds": load["gap_seconds"], "dtype": "float32",
                          "tp": 2, "rounds": rounds, "segment_seconds": segment, "settle_seconds": settle,
                          "cold_seconds": cold, "statistic": "5% trimmed mean of the critical path",
                          "injected_gather_delay_seconds": gather_delay,
                          "policy": load["policy"]},
                  by_actual_mode=actual, cold_probe_share=stats["probe_share"],
                  cold_probe_cost_share=stats.get("probe_cost_share"), cold_learned_table=learned["table"],
                  cold_decisions=decision_timeline(decisions_cold, cold_calls, start, auto_wall),
                  warm_auto_decisions=len([d for d in decisions_warm if d["reason"] == "auto"]),
                  sidecar_core_percent={v: 100.0 * c / w for v, (c, w) in sidecar_cpu.items() if w > 0},
                  load_average=os.getloadavg())
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.auto_policy", description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=("fast", "slow"), default="fast")
    p.add_argument("--greedy-share", type=float, default=0.8,
                   help="slow workload: share of each batch size's calls that are greedy (the rest top-p)")
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds of the variants")
    p.add_argument("--segment", type=float, help="seconds per variant segment (default 10; slow: 60)")
    p.add_argument("--settle", type=float, help="seconds at the start of every segment not measured (3; slow: 10)")
    p.add_argument("--cold", type=float, help="seconds of the cold-start auto run (default 90; slow: 240)")
    p.add_argument("--gather-delay", type=float, default=0.0,
                   help="seconds added to every gather (control.inject_delay), to give this machine a crossover")
    p.add_argument("--out", default="out/auto_policy", help="directory for auto_policy.json and .png")
    args = p.parse_args(argv)
    slow = args.workload == "slow"
    segment = args.segment if args.segment is not None else 60.0 if slow else 10.0
    settle = args.settle if args.settle is not None else 10.0 if slow else 3.0
    cold = args.cold if args.cold is not None else 240.0 if slow else 90.0
    if not 0.0 <= args.greedy_share <= 1.0:
        p.error("--greedy-share must be in [0, 1]")
    workdir = tempfile.mkdtemp(prefix="gw-bench-auto-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        if not 0 <= settle < segment:
            p.error("--settle must be >= 0 and shorter than --segment")
        result = run(args.rounds, segment, settle, cold, workdir, args.gather_delay,
                     workload(args.workload, args.greedy_share))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "auto_policy.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(out / "auto_policy.png", result)
    print(json.dumps({k: result[k] for k in ("ratio_to_oracle", "best_static_by_bucket", "cold_learned_table",
                                             "cold_decisions", "cold_probe_share", "cold_probe_cost_share",
                                             "sidecar_core_percent")},
                     indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
