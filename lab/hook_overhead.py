"""Hook overhead per logits call: the path with recording on vs off vs the bare collective.

    python -m lab.hook_overhead [--tp 2] [--iters 300] [--warmup 30] [--out out/hook_overhead]

Variants, interleaved call by call (a rotating order, so drift of the machine hits all alike), on TP ranks:
  bare — all_gather_into_tensor of the shard + greedy argmax over the gathered shards (no hooks at all)
  off  — LogitsPath in all_gather mode, greedy rows, no recorder (telemetry.enabled=false)
  on   — the same LogitsPath with a RingRecorder writing to shared memory
Each call is timed as max(end over ranks) - min(start over ranks) after a barrier. gloo on this CPU is noisy
(±40 % run to run), far more than the ~1 µs recording adds, so record() is also timed in isolation: a tight
loop of calls with realistic arguments, minus the empty loop, and in a TP=1 path (no gloo) A/B against no
recorder and a no-op recorder; both in thread CPU time. Writes results.json and hook_overhead.png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gatherwise.bench.figures import pyplot, save
from gatherwise.engine_hooks.call_marks import CallMarks
from gatherwise.shm_format.ring import engine_dir_name

if TYPE_CHECKING:
    from gatherwise.engine_hooks.comm import TorchDistCommunicator
    from gatherwise.engine_hooks.recorder import RingRecorder

Marks = dict[str, list[tuple[int, int]]]  # variant -> (start, end) ns per timed call

SHAPES = ((1, 32000), (16, 152064))  # (rows, vocab)
SMALL_SHAPE_ITERS_FACTOR = 8  # B=1 calls cost < 1 ms: give that shape 8x the calls to tame the noise
SMALL_SHAPE_MAX_ELEMENTS = 32000  # rows x vocab up to this is a small shape
WARMUP_ROUNDS = 2  # of the recorder variants' interleaved rounds, not timed
VARIANTS = ("bare", "off", "on")


def _rank_bench(rank: int, world: int, shapes: Sequence[tuple[int, int]], iters: int, warmup: int,
                shm_dir: str) -> dict[str, Marks]:
    from gatherwise.engine_hooks.comm import TorchDistCommunicator

    comm = TorchDistCommunicator()
    def calls(rows: int, vocab: int) -> int:
        return iters * (SMALL_SHAPE_ITERS_FACTOR if rows * vocab <= SMALL_SHAPE_MAX_ELEMENTS else 1)

    return {f"{rows}x{vocab}": _measure_shape(comm, rank, world, rows, vocab, calls(rows, vocab), warmup, shm_dir)
            for rows, vocab in shapes}


def _measure_shape(comm: TorchDistCommunicator, rank: int, world: int, rows: int, vocab: int, iters: int,
                   warmup: int, shm_dir: str) -> Marks:
    """(start, end) ns per timed call of each variant on this rank."""
    import torch
    import torch.distributed as dist

    from gatherwise.engine_hooks.logits_path import LogitsPath
    from gatherwise.engine_hooks.recorder import RingRecorder
    from gatherwise.engine_hooks.sampling import SamplingParams, SamplingRow
    from gatherwise.modes import Mode, ModeTable
    from gatherwise.shm_format.ring import ring_path

    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    table = ModeTable.uniform(Mode.ALL_GATHER)
    recorder = RingRecorder(ring_path(shm_dir, rows, rank), engine_id=rows, rank=rank, tp_size=world,
                            vocab=vocab, dtype="float32", capacity=8192)
    paths = {"off": LogitsPath(comm, vocab, initial_table=table),
             "on": LogitsPath(comm, vocab, initial_table=table, recorder=recorder)}
    width = paths["off"].width
    shard = torch.randn(rows, width, generator=torch.Generator().manual_seed(rank))
    send = shard.clone()
    recv = torch.empty(world * rows * width)
    sampling = [SamplingRow(SamplingParams(), request_id=i, position=0) for i in range(rows)]

    def bare():  # greedy over shards without copying them: per-shard max, then the best shard per row
        gather(recv, send.view(-1))
        values, index = recv.view(world, rows, width).max(dim=-1)
        best = values.argmax(dim=0)
        return best * width + index.gather(0, best.unsqueeze(0))[0]

    def hooked(path):
        path.logits_buffer(rows).copy_(shard)  # the LM head's write; timed in both hooked variants
        return path.run(sampling)

    calls = {"bare": bare, "off": lambda: hooked(paths["off"]), "on": lambda: hooked(paths["on"])}
    marks: Marks = {v: [] for v in VARIANTS}
    for i in range(warmup + iters):
        for variant in VARIANTS[i % 3:] + VARIANTS[: i % 3]:
            dist.barrier()
            t0 = time.perf_counter_ns()
            calls[variant]()
            t1 = time.perf_counter_ns()
            if i >= warmup:
                marks[variant].append((t0, t1))
    recorder.close(unlink=True)
    return marks


def _ring_recorder(path: str, *, pure_python: bool, **kw: Any) -> RingRecorder:
    """A RingRecorder with the compiled record() (when built) or the pure-Python fallback."""
    from gatherwise.engine_hooks.recorder import PURE_PYTHON_ENV, RingRecorder

    before = os.environ.get(PURE_PYTHON_ENV)
    os.environ[PURE_PYTHON_ENV] = "1" if pure_python else "0"
    try:
        return RingRecorder(path, **kw)
    finally:
        if before is None:
            del os.environ[PURE_PYTHON_ENV]
        else:
            os.environ[PURE_PYTHON_ENV] = before


def record_cost_us(calls: int = 200_000, repeats: int = 7, pure_python: bool = False) -> list[float]:
    """µs per RingRecorder.record() call in a tight loop (empty loop subtracted), one value per repeat.

    Thread CPU time, not wall time: on a shared machine the wall clock also counts time the thread was not
    running at all."""
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as d:
        rec = _ring_recorder(os.path.join(d, "rank-0"), pure_python=pure_python, engine_id=1, rank=0, tp_size=2,
                             vocab=32000, dtype="float32", capacity=8192)
        record = rec.record
        out = []
        for r in range(repeats):
            gathering = r % 2  # alternate modes: gather mode also fills the broadcast counters
            b0, b1 = (1_300, 1_900) if gathering else (0, 0)
            marks = CallMarks(0, gathering, 16, 0, 9_732_608, 1_000, 1_100, 1_200, b0, b1, 1_200, 1_300, 2_000)
            t = time.thread_time_ns()
            for i in range(calls):  # one record refilled per call, as the path does (logits_path._end_call)
                marks.call_index = i
                record(marks)
            loop = time.thread_time_ns() - t
            t = time.thread_time_ns()
            for _ in range(calls):
                pass
            empty = time.thread_time_ns() - t
            out.append((loop - empty) / calls / 1000)
        rec.close()
    return out


class _NoopRecorder:
    def record(self, marks: CallMarks, /) -> None:
        pass


def single_rank_path_us(rounds: int = 60, block: int = 100) -> dict:
    """The recording cost as the path sees it (cold caches between calls), without gloo's noise: a TP=1
    LogitsPath (B=1, V=32000) with no recorder, a no-op recorder (the hook's own plumbing), the RingRecorder
    with its pure-Python record() (`on_python`: the writer before the compiled one) and with the compiled
    record() (`on`), in interleaved blocks of calls; per-call medians of thread CPU time in µs."""
    import torch

    from gatherwise.engine_hooks.comm import SingleRankCommunicator
    from gatherwise.engine_hooks.logits_path import LogitsPath
    from gatherwise.engine_hooks.sampling import SamplingParams, SamplingRow
    from gatherwise.modes import Mode, ModeTable

    torch.set_num_threads(1)
    table = ModeTable.uniform(Mode.ALL_GATHER)
    sampling = [SamplingRow(SamplingParams(), request_id=0, position=0)]
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as d:
        kw = dict(engine_id=3, rank=0, tp_size=1, vocab=32000, dtype="float32", capacity=8192)
        rec = _ring_recorder(os.path.join(d, "rank-0"), pure_python=False, **kw)
        rec_py = _ring_recorder(os.path.join(d, "rank-1"), pure_python=True, **kw)
        recorders = {"off": None, "noop": _NoopRecorder(), "on_python": rec_py, "on": rec}
        paths = {k: LogitsPath(SingleRankCommunicator(), 32000, initial_table=table, recorder=r)
                 for k, r in recorders.items()}
        logits = torch.randn(1, paths["off"].width)
        times: dict[str, list[int]] = {k: [] for k in paths}
        names = list(paths)
        for r in range(rounds + WARMUP_ROUNDS):
            for variant in names[r % len(names):] + names[: r % len(names)]:
                path, out = paths[variant], times[variant]
                for _ in range(block):
                    t = time.thread_time_ns()
                    path.logits_buffer(1).copy_(logits)
                    path.run(sampling)
                    if r >= WARMUP_ROUNDS:
                        out.append(time.thread_time_ns() - t)
        rec.close()
        rec_py.close()
    med = {k: statistics.median(v) / 1000 for k, v in times.items()}
    return {"median_us": med, "compiled_writer": rec.native, "added_on_minus_off_us": med["on"] - med["off"],
            "added_on_python_minus_off_us": med["on_python"] - med["off"],
            "added_on_minus_noop_us": med["on"] - med["noop"], "calls_per_variant": rounds * block}


def summarize(per_rank: list[dict], shape: str) -> dict:
    spans = {}
    for variant in VARIANTS:
        per_call = zip(*(r[shape][variant] for r in per_rank), strict=True)
        spans[variant] = [(max(e for _, e in c) - min(s for s, _ in c)) / 1000 for c in per_call]

    def stats(xs):
        q = statistics.quantiles(xs, n=10)
        return {"median_us": statistics.median(xs), "p10_us": q[0], "p90_us": q[-1], "n": len(xs)}

    med = {v: statistics.median(spans[v]) for v in VARIANTS}
    paired = [on - off for on, off in zip(spans["on"], spans["off"], strict=True)]
    return {"variants": {v: stats(spans[v]) for v in VARIANTS},
            "ratio_on_off": med["on"] / med["off"], "ratio_off_bare": med["off"] / med["bare"],
            "ratio_on_bare": med["on"] / med["bare"],
            "added_by_recording_us": med["on"] - med["off"], "paired_median_on_minus_off_us": statistics.median(paired),
            "spans_us": spans}


def plot(path: Path, result: dict) -> None:
    plt = pyplot()
    shapes = list(result["shapes"])
    fig, axes = plt.subplots(1, len(shapes) + 2, figsize=(4.6 * (len(shapes) + 2), 3.8))
    for ax, shape in zip(axes[:-2], shapes, strict=True):
        s = result["shapes"][shape]
        ax.boxplot([s["spans_us"][v] for v in VARIANTS], showfliers=False)
        ax.set_xticks(range(1, len(VARIANTS) + 1), VARIANTS)
        ax.set_ylabel("µs per call (cross-rank span)")
        ax.set_title(f"B×V = {shape}, TP={result['tp']}\non/off {s['ratio_on_off']:.3f}, "
                     f"off/bare {s['ratio_off_bare']:.3f}", fontsize=9)
    ax = axes[-2]
    med = result["single_rank_path"]["median_us"]
    bars = ax.bar(list(med), list(med.values()), color=["tab:grey", "tab:blue", "tab:orange", "tab:green"][:len(med)])
    ax.bar_label(bars, fmt="%.1f", fontsize=8)
    ax.set_ylim(min(med.values()) * 0.95, max(med.values()) * 1.03)
    ax.set_ylabel("µs per call (thread CPU, median)")
    ax.set_title(f"TP=1 path B=1 V=32000: recording adds "
                 f"{result['single_rank_path']['added_on_minus_off_us']:.1f} µs", fontsize=9)
    ax = axes[-1]
    ax.bar(range(len(result["record_us"])), result["record_us"], color="tab:green")
    ax.axhline(2.0, color="red", linestyle="--", linewidth=1, label="target 2 µs")
    ax.set_xlabel("repeat")
    ax.set_ylabel("µs per record()")
    ax.set_title(f"record() in isolation (compiled): median {result['record_us_median']:.2f} µs", fontsize=9)
    ax.legend(fontsize=8)
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.hook_overhead",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("out/hook_overhead"))
    parser.add_argument("--path-runs", type=int, default=5,
                        help="repeat the TP=1 path A/B this many times; the result is the median of the runs")
    parser.add_argument("--path-rounds", type=int, default=60,
                        help="interleaved rounds of each TP=1 path A/B run (blocks of 100 calls per variant)")
    parser.add_argument("--record-calls", type=int, default=200_000,
                        help="record() calls per repeat of the isolated loop")
    args = parser.parse_args(argv)
    from gatherwise.bench.launch import run_ranks

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as shm_dir:
        for rows, _ in SHAPES:
            os.makedirs(os.path.join(shm_dir, engine_dir_name(rows)))
        per_rank = run_ranks(_rank_bench, args.tp, SHAPES, args.iters, args.warmup, shm_dir)
    record_us = record_cost_us(args.record_calls)
    record_us_python = record_cost_us(args.record_calls, pure_python=True)
    runs = [single_rank_path_us(args.path_rounds) for _ in range(max(1, args.path_runs))]
    single = {"median_us": {k: statistics.median(r["median_us"][k] for r in runs) for k in runs[0]["median_us"]},
              "compiled_writer": runs[0]["compiled_writer"], "calls_per_variant": runs[0]["calls_per_variant"],
              "runs": runs}
    for key in ("added_on_minus_off_us", "added_on_python_minus_off_us", "added_on_minus_noop_us"):
        single[key] = statistics.median(r[key] for r in runs)
        single[key.replace("_us", "_per_run_us")] = [r[key] for r in runs]
    result = {"tp": args.tp, "backend": "gloo", "iters": args.iters, "warmup": args.warmup,
              "host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
              "record_us": record_us, "record_us_median": statistics.median(record_us),
              "record_us_min": min(record_us), "record_us_python": record_us_python,
              "record_us_python_median": statistics.median(record_us_python), "single_rank_path": single,
              "loadavg_before": load_before, "loadavg": os.getloadavg(),
              "shapes": {f"{r}x{v}": summarize(per_rank, f"{r}x{v}") for r, v in SHAPES}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    plot(args.out / "hook_overhead.png", result)
    print(f"record() in isolation: compiled median {result['record_us_median']:.2f} µs per call "
          f"(repeats: {', '.join(f'{x:.2f}' for x in record_us)}); pure Python "
          f"{result['record_us_python_median']:.2f} µs")
    m = single["median_us"]
    print(f"TP=1 path B=1 V=32000 (medians of {len(runs)} runs of per-call medians): off {m['off']:.1f} µs, "
          f"no-op recorder {m['noop']:.1f} µs, pure-Python RingRecorder {m['on_python']:.1f} µs, compiled "
          f"{m['on']:.1f} µs -> recording adds {single['added_on_minus_off_us']:.2f} µs compiled "
          f"(runs: {', '.join(f'{x:.2f}' for x in single['added_on_minus_off_per_run_us'])}), "
          f"{single['added_on_python_minus_off_us']:.2f} µs pure Python "
          f"(runs: {', '.join(f'{x:.2f}' for x in single['added_on_python_minus_off_per_run_us'])})")
    print(f"load average: {load_before[0]:.1f} before, {result['loadavg'][0]:.1f} after")
    print(f"{'shape':>10} {'bare µs':>9} {'off µs':>9} {'on µs':>9} {'on/off':>7} {'off/bare':>8} "
          f"{'on-off µs':>9} {'paired':>7}")
    for shape, s in result["shapes"].items():
        v = s["variants"]
        print(f"{shape:>10} {v['bare']['median_us']:9.1f} {v['off']['median_us']:9.1f} {v['on']['median_us']:9.1f} "
              f"{s['ratio_on_off']:7.3f} {s['ratio_off_bare']:8.3f} {s['added_by_recording_us']:9.1f} "
              f"{s['paired_median_on_minus_off_us']:7.1f}")
    print(f"wrote {args.out / 'results.json'} and {args.out / 'hook_overhead.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
