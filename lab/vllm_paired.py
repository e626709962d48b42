"""Modes side by side inside one vLLM engine: greedy throughput per mode and batch size, paired, and where each
mode's time goes (the path's marks, the time between calls, each rank's wait).

    .venv-vllm/bin/python -m lab.vllm_paired --out out/vllm-paired [--batches 1,8,32,64]
        [--samples 12] [--tokens 32] [--shape qwen2.5-0.5b-shape]
    .venv/bin/python -m lab.vllm_paired --plot out/vllm-paired/results.json   # the PNG

One engine (TP=2 on CPU, vLLM's offline LLM with the engine core in process, the plugin on), the random-weight
checkpoint of `gatherwise bench serve`. For every sample and batch size the modes run back to back in an order
that alternates (A B C, then C B A), each set through the engine's control block and applied by a warm-up
generation before the timed one, so drift on a shared machine lands on every mode alike; ratios are taken per
sample against that sample's all_gather run, and their median is reported. The rings give, per timed run and
rank: the path's own time per call (and its collectives, sampling, broadcast), and the gap between one call's
end and the next call's start (the rest of the engine's step: forward, scheduling, bookkeeping).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm import LLM

    from gatherwise.bench.serve.checkpoints import ModelShape
    from gatherwise.shm_format.ring import CallRecord

MODES = ("all_gather", "gather", "sharded")
MS = 1e-6


def _engine(model: str, shm_dir: str) -> LLM:
    os.environ.update(GATHERWISE_ENABLE="1", GATHERWISE_ENGINE_SHM_DIR=shm_dir, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    from vllm import LLM

    return LLM(model=model, tensor_parallel_size=2, enforce_eager=True, max_model_len=512,
               distributed_executor_backend="mp", skip_tokenizer_init=True, seed=0)


def _prompts(batch: int, vocab: int) -> list:
    from vllm.inputs import TokensPrompt

    return [TokensPrompt(prompt_token_ids=[(17 * i + 31 * j) % (vocab - 10) + 5 for j in range(16)])
            for i in range(batch)]


class _Rings:
    """Every rank's records, read as they come."""

    def __init__(self, shm_dir: str) -> None:
        from gatherwise.sidecar.ingest.ring_reader import RingReader, discover_engines

        (engine,) = discover_engines(shm_dir)[:1]
        self.readers = {rank: RingReader(path) for rank, path in sorted(engine.rings.items())}
        from gatherwise.sidecar.control.block_client import ControlClient

        if engine.control is None:
            raise RuntimeError(f"engine {engine.dir} has no control block (control disabled?)")
        self.control = ControlClient(engine.control)
        self.records: dict[int, dict[int, CallRecord]] = {rank: {} for rank in self.readers}

    def read(self) -> None:
        for rank, reader in self.readers.items():
            records, _ = reader.read_new()
            self.records[rank].update((r.call_index, r) for r in records)

    def last_call(self) -> int:
        return self.control.heartbeat().call_index


def _marks(rings: _Rings, first: int, last: int) -> dict:
    """Per rank, medians over the calls first..last (ms): path, collective, second op, sampling, gap to the next."""
    out = {}
    for rank, records in rings.records.items():
        calls = [records[c] for c in range(first, last + 1) if c in records]
        gaps = [b.start_ns - a.end_ns for a, b in itertools.pairwise(calls)]
        out[str(rank)] = {"calls": len(calls), "modes": sorted({int(r.mode) for r in calls}),
                          "path_ms": _median([r.end_ns - r.start_ns for r in calls]),
                          "collective_ms": _median([r.collective_ns for r in calls]),
                          "second_op_ms": _median([r.second_ns for r in calls]),
                          "sample_ms": _median([r.sample_ns for r in calls]),
                          "gap_ms": _median(gaps)}
    return out


def _median(values: list[int]) -> float | None:
    return round(statistics.median(values) * MS, 4) if values else None


def measure(args: argparse.Namespace) -> dict:
    from gatherwise.bench.serve.checkpoints import MODEL_SHAPES, build_checkpoint

    shape = MODEL_SHAPES[args.shape]
    model = str(build_checkpoint(shape, Path(args.models) / shape.name))
    shm_dir = f"/dev/shm/gatherwise-vllm-paired-{os.getpid()}"
    try:
        return _measure(args, shape, model, shm_dir)
    finally:
        shutil.rmtree(shm_dir, ignore_errors=True)


def _measure(args: argparse.Namespace, shape: ModelShape, model: str, shm_dir: str) -> dict:
    from vllm import SamplingParams

    from gatherwise.modes import Mode, ModeTable

    llm = _engine(model, shm_dir)
    greedy = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True, detokenize=False)
    warm = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, detokenize=False)
    llm.generate(_prompts(2, shape.vocab), warm, use_tqdm=False)  # the hooks install at the first step
    rings = _Rings(shm_dir)
    runs = []
    started = time.time()
    for sample in range(args.samples):
        order = MODES if sample % 2 == 0 else tuple(reversed(MODES))
        for batch in args.batches:
            prompts = _prompts(batch, shape.vocab)
            for mode in order:
                rings.control.write_command(ModeTable.uniform(Mode.parse(mode)))
                llm.generate(prompts, warm, use_tqdm=False)  # applies the table (two calls after rank 0 sent it)
                first = rings.last_call() + 1
                t0 = time.perf_counter()
                llm.generate(prompts, greedy, use_tqdm=False)
                elapsed = time.perf_counter() - t0
                last = rings.last_call()
                rings.read()
                runs.append({"sample": sample, "batch": batch, "mode": mode, "seconds": elapsed,
                             "tokens_per_s": batch * args.tokens / elapsed, "marks": _marks(rings, first, last)})
        print(f"sample {sample + 1}/{args.samples} done ({time.time() - started:.0f} s)", file=sys.stderr, flush=True)
    return {"shape": shape.about, "batches": args.batches, "samples": args.samples, "tokens": args.tokens,
            "load_average_before_after": [args.load_before, os.getloadavg()], "cpus": os.cpu_count(), "runs": runs,
            "summary": summarise(runs, args.batches)}


def summarise(runs: list[dict], batches: list[int]) -> list[dict]:
    """Per batch size and mode: median tok/s, the median of per-sample ratios to all_gather, and median marks."""
    rows = []
    for batch in batches:
        base = {r["sample"]: r["tokens_per_s"] for r in runs if r["batch"] == batch and r["mode"] == "all_gather"}
        for mode in MODES:
            mine = [r for r in runs if r["batch"] == batch and r["mode"] == mode]
            ratios = [r["tokens_per_s"] / base[r["sample"]] for r in mine if r["sample"] in base]
            ranks = {rank: {key: statistics.median(v for r in mine if (v := r["marks"][rank][key]) is not None)
                            for key in ("path_ms", "collective_ms", "second_op_ms", "sample_ms", "gap_ms")}
                     for rank in mine[0]["marks"]}
            rows.append({"batch": batch, "mode": mode,
                         "tokens_per_s": statistics.median(r["tokens_per_s"] for r in mine),
                         "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                         "ranks": ranks})
    return rows


def table(summary: list[dict]) -> str:
    lines = ["| B | mode | tok/s | × all_gather (median; min–max) | path ms r0 / r1 | gap to next call ms r0 / r1 | "
             "second op ms r0 / r1 |", "|---|---|---|---|---|---|---|"]
    for row in summary:
        r0, r1 = row["ranks"]["0"], row["ranks"]["1"]
        lines.append(f"| {row['batch']} | {row['mode']} | {row['tokens_per_s']:.1f} | {row['ratio']:.3f} "
                     f"({row['ratio_min']:.3f}–{row['ratio_max']:.3f}) | {r0['path_ms']:.2f} / {r1['path_ms']:.2f} | "
                     f"{r0['gap_ms']:.2f} / {r1['gap_ms']:.2f} | {r0['second_op_ms']:.2f} / {r1['second_op_ms']:.2f} |")
    return "\n".join(lines)


def plot(results: Path) -> Path:
    from gatherwise.bench.figures import pyplot, save

    data = json.loads(results.read_text())
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    batches = data["batches"]
    for mode in MODES:
        ratios = [next(r["ratio"] for r in data["summary"] if r["batch"] == b and r["mode"] == mode)
                  for b in batches]
        ax.plot(batches, ratios, marker="o", label=mode)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size (greedy)")
    ax.set_ylabel("tok/s ÷ all_gather (paired median)")
    ax.set_title("vLLM TP=2, one engine, modes switched between runs")
    ax.legend()
    return save(fig, results.with_name("vllm-paired.png"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("out/vllm-paired"))
    p.add_argument("--models", type=Path, default=Path("out/models"), help="where the checkpoint is built")
    p.add_argument("--shape", default="qwen2.5-0.5b-shape")
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 64])
    p.add_argument("--samples", type=int, default=12)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--plot", type=Path, help="draw the PNG of an earlier results.json (needs matplotlib)")
    args = p.parse_args(argv)
    if args.plot:
        print(plot(args.plot))
        return 0
    args.load_before = os.getloadavg()
    result = measure(args)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.json"
    path.write_text(json.dumps(result, indent=1))
    print(table(result["summary"]))
    print(f"wrote {path}; load average before {result['load_average_before_after'][0]}, after "
          f"{result['load_average_before_after'][1]}")
    try:
        print(plot(path))
    except ImportError:
        print(f"for the PNG: .venv/bin/python -m lab.vllm_paired --plot {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
