"""`gatherwise bench sampler`: the sampler alone — gatherwise's against each engine's own, on this CPU.

Variants, timed interleaved call by call on the same logits (each call gets a fresh copy, made untimed, since
the engines' samplers write into their input):

- `gatherwise/all_gather`: gatherwise.engine_hooks.sampling.sample on the received layout [P, B, W] (the
  all_gather and gather modes' sampler, P = --tp);
- `gatherwise/sharded`: one rank of sharded mode (ShardedSampler.run on its own shard), in this process: the
  other ranks' messages, computed beforehand (they are deterministic), are replayed by a stand-in
  communicator that copies them, so the time is one rank's summaries, combine, owner search and fallback —
  what a rank computes, without the wire;
- `sglang`: SGLang's CPU sampling path as `Sampler.forward` runs it with the pytorch backend (temperature
  division in place, its softmax, `top_k_top_p_min_p_sampling_from_probs_torch`);
- `vllm`: vLLM V1's (`Sampler.apply_temperature`, min-p as its `MinPLogitsProcessor.apply`,
  `TopKTopPSampler.forward`, which on x86 CPUs is `forward_cpu`).

An engine that does not import in this interpreter is reported as such (run the bench from its venv) and the
rest is measured. Logits: `realistic` (gatherwise.bench.realistic_logits: Zipf ranks, each row at an entropy
drawn from trained models' rows, or every row at --entropy nats), `flat`
(N(0, 1), a random-weight head's: the worst case) and `real:<model>`, a trained model's own next-token rows as
`python -m gatherwise.bench.real_rows` saves them (--rows-dir, rows-<model>-T<t>.pt, the rows sampled at the
sampling's temperature; B of them drawn at random per batch, as a batch holds unrelated requests; its vocab and,
unless --tp says otherwise, its engine TP). Writes results.json and sampler.png to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gatherwise.bench.arg_types import at_least, int_list, name_list

SAMPLINGS = {  # name -> (temperature, top_k, top_p, min_p)
    "top_p": (0.8, 0, 0.95, 0.0),
    "top_p_t1": (1.0, 0, 0.95, 0.0),
    "top_k": (0.8, 50, 1.0, 0.0),
    "min_p": (0.8, 0, 1.0, 0.05),
}
LOGITS = ("realistic", "flat")
REAL = "real:"  # real:<model>, a trained model's rows
DEFAULT_SAMPLINGS = ("top_p", "top_k", "min_p")
ENGINES = ("sglang", "vllm")


@dataclass(frozen=True)
class Shape:
    vocab: int
    logits: str
    sampling: str
    batch: int


Sampler = Callable[[Any], Any]  # fresh inputs -> tokens


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gatherwise bench sampler", description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int_list("--vocab", 2), default=(151936, 32000),
                   help="comma-separated vocab sizes, default 151936,32000")
    p.add_argument("--batch", type=int_list("--batch", 1), default=(1, 4, 16, 32, 64),
                   help="comma-separated batch rows, default 1,4,16,32,64")
    p.add_argument("--sampling", type=name_list("--sampling", _choice("--sampling", SAMPLINGS)),
                   default=DEFAULT_SAMPLINGS, help="comma-separated of " + ", ".join(
                       f"{k} (T {t}, top-k {k_}, top-p {p_}, min-p {m})" for k, (t, k_, p_, m) in SAMPLINGS.items()))
    p.add_argument("--logits", type=name_list("--logits", _logits_source), default=LOGITS,
                   help="comma-separated of realistic, flat, real:<model> (a trained model's rows, see --rows-dir); "
                   "default realistic,flat")
    p.add_argument("--rows-dir", type=Path, default=Path("out/real_rows"),
                   help="where real:<model> finds rows-<model>-T<t>.pt (python -m gatherwise.bench.real_rows), "
                   "default out/real_rows")
    p.add_argument("--entropy", type=float, default=None,
                   help="every realistic row at this next-token entropy (nats, T = 1); default each row at one "
                   "drawn from trained models' rows (gatherwise.bench.realistic_logits)")
    p.add_argument("--engines", type=name_list("--engines", _choice("--engines", ENGINES)), default=ENGINES,
                   help="engine samplers to try, default sglang,vllm (each only where it imports)")
    p.add_argument("--tp", type=at_least("--tp", 2), default=None,
                   help="shards P of the gatherwise variants, default 2 (real rows: the model's engine TP)")
    p.add_argument("--threads", type=at_least("--threads", 1), default=1,
                   help="torch threads for every variant, default 1 (a TP=2 rank's share of a 2-core host)")
    p.add_argument("--iters", type=at_least("--iters", 1), default=10, help="timed calls per variant, default 10")
    p.add_argument("--warmup", type=at_least("--warmup", 0), default=2, help="untimed calls first, default 2")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("out/sampler"), help="output directory, default out/sampler")
    return p


def _logits_source(text: str) -> str:
    from gatherwise.tp_engine.trained_models import MODELS

    if text in LOGITS or (text.startswith(REAL) and text[len(REAL):] in MODELS):
        return text
    raise ValueError(f"unknown logits {text!r}: expected one of {', '.join(LOGITS)}, "
                     + ", ".join(REAL + m for m in MODELS))


def real_rows(source: str, rows_dir: Path, temperature: float) -> Any:
    """A trained model's next-token rows [N, V] float32, sampled at this temperature."""
    import torch

    path = rows_dir / f"rows-{source[len(REAL):]}-T{temperature}.pt"
    if not path.is_file():
        raise SystemExit(f"{path}: no real rows; make them with python -m gatherwise.bench.real_rows "
                         f"--model {source[len(REAL):]} --out {rows_dir}")
    return torch.load(path).float()


def _choice(flag: str, names: Any) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in names:
            raise ValueError(f"unknown {flag.lstrip('-')} {text!r}: expected one of {', '.join(names)}")
        return text
    return parse


# -- the variants ----------------------------------------------------------------------------------------------
def gatherwise_variants(logits: Any, sampling: str, tp: int
                        ) -> tuple[dict[str, tuple[Sampler, Callable[[], Any]]], ReplayRank]:
    """name -> (sampler, its inputs), and the sharded rank (its last call says how many rows fell back). The
    inputs are built untimed; the sampler call is what is timed. gatherwise's samplers do not write their input."""
    from gatherwise.engine_hooks.logits_path import shard_width
    from gatherwise.engine_hooks.sampling import SamplingParams, SamplingRow, sample

    batch, vocab = logits.shape
    t, k, p, m = SAMPLINGS[sampling]
    params = SamplingParams(temperature=t, top_k=k, top_p=p, seed=1, min_p=m)
    rows = [SamplingRow(params, request_id=i, position=17) for i in range(batch)]
    width = shard_width(vocab, tp)
    padded = logits.new_full((batch, tp * width), float("-inf"))
    padded[:, :vocab] = logits
    layout = padded.view(batch, tp, width).permute(1, 0, 2).contiguous()  # what all_gather delivers
    replay = ReplayRank(layout, rows, width)
    return {
        "gatherwise/all_gather": (lambda x: sample(x, vocab, rows), lambda: layout),
        "gatherwise/sharded": (replay.run, lambda: replay.shards[0]),
    }, replay


class ReplayComm:
    """A Communicator for one rank whose peers' messages are known: all_gather puts this rank's message at its
    slot and the recorded ones at theirs. With `record` it captures this rank's message and stops the call."""

    def __init__(self, rank: int, world_size: int, peers: list[list[Any]], record: bool = False) -> None:
        self.rank, self.world_size, self.peers, self.record = rank, world_size, peers, record
        self.sent: list[Any] = []

    def all_gather(self, out: Any, inp: Any) -> None:
        i = len(self.sent)
        self.sent.append(inp.clone())
        if self.record and i >= len(self.peers[self.rank]):
            raise _Recorded
        for r in range(self.world_size):
            out[r].copy_(inp if r == self.rank else self.peers[r][i])

    def gather(self, out: Any, inp: Any) -> None:
        raise NotImplementedError("sharded mode uses all_gather only")

    def broadcast(self, tensor: Any) -> None:
        raise NotImplementedError("sharded mode uses all_gather only")


class _Recorded(Exception):
    pass


class ReplayRank:
    """Rank 0 of sharded mode, runnable alone: every rank's messages are recorded first, collective by
    collective (a rank's i-th message depends only on its shard and the messages before it)."""

    def __init__(self, layout: Any, rows: list[Any], width: int) -> None:
        import torch

        from gatherwise.engine_hooks.sharded_exchange import ShardedSampler

        self.rows, self.world = rows, layout.shape[0]
        self.shards = [layout[r].contiguous() for r in range(self.world)]
        sent: list[list[Any]] = [[] for _ in range(self.world)]
        while True:  # at most two collectives: the exchange, then the resolve
            done = True
            for r in range(self.world):
                comm = ReplayComm(r, self.world, sent, record=True)
                try:
                    ShardedSampler(comm, width, dtype=layout.dtype, device=torch.device("cpu")).run(
                        self.shards[r], rows, 0)
                except _Recorded:
                    done = False
                sent[r] = comm.sent
            if done:
                break
        self.sent = sent
        self.sampler = ShardedSampler(ReplayComm(0, self.world, sent), width, dtype=layout.dtype,
                                      device=torch.device("cpu"))
        self.last: Any = None

    def run(self, shard: Any) -> Any:
        self.sampler.comm = ReplayComm(0, self.world, self.sent)
        self.last = self.sampler.run(shard, self.rows, 0)
        return self.last.tokens


def engine_variant(engine: str, logits: Any, sampling: str) -> tuple[Sampler, Callable[[], Any]]:
    """The engine's own sampler for these rows, or ImportError where the engine is not installed here."""
    import torch

    batch = logits.shape[0]
    t, k, p, m = SAMPLINGS[sampling]
    if engine == "sglang":
        from sglang.kernels.ops.sampling import softmax as sglang_softmax
        from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch
        from sglang.srt.sampling.sampling_params import TOP_K_ALL

        temperatures = torch.full((batch, 1), t)  # SamplingBatchInfo's tensors, built before the forward
        top_ks = torch.full((batch,), k or TOP_K_ALL, dtype=torch.int32)
        top_ps, min_ps = torch.full((batch,), p), torch.full((batch,), m)
        positions = torch.full((batch,), 17, dtype=torch.int64)

        def sglang_sample(x: Any) -> Any:  # Sampler.forward, pytorch backend, not deterministic, no logprobs
            x.div_(temperatures)
            x[:] = sglang_softmax(x)
            return top_k_top_p_min_p_sampling_from_probs_torch(x, top_ks, top_ps, min_ps, m > 0, None, positions,
                                                                max_top_k=k or None)
        return sglang_sample, logits.clone
    if engine == "vllm":
        from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor
        from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler
        from vllm.v1.sample.sampler import Sampler as VllmSampler

        temperature = torch.full((batch,), t)
        ks = torch.full((batch,), k, dtype=torch.int64) if k else None
        ps = torch.full((batch,), p) if p < 1.0 else None
        min_p = SimpleNamespace(min_p_count=batch, min_p=torch.full((batch, 1), m))  # the processor's state
        topk_topp = TopKTopPSampler()

        def vllm_sample(x: Any) -> Any:  # Sampler.sample for an all-random batch, no per-request generators
            x = VllmSampler.apply_temperature(x, temperature, True)
            if m > 0:
                x = MinPLogitsProcessor.apply(min_p, x)
            return topk_topp(x, {}, ks, ps)[0]
        return vllm_sample, logits.clone
    raise ValueError(engine)


# -- measuring -------------------------------------------------------------------------------------------------
def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from gatherwise.bench.realistic_logits import flat_logits, nucleus_sizes, realistic_logits

    torch.set_num_threads(args.threads)
    engines: dict[str, str] = {}
    for engine in args.engines:
        try:
            engine_variant(engine, torch.zeros(1, 8), "top_p")
            engines[engine] = "measured"
        except Exception as exc:  # an engine not installed here (or not importable on this host): say so
            engines[engine] = f"not measured: {type(exc).__name__}: {exc}"
            print(f"[bench sampler] {engine}: {engines[engine]}", file=sys.stderr)
    from gatherwise.tp_engine.trained_models import MODELS

    results = []
    for kind in args.logits:
        real = kind.startswith(REAL)
        tp = args.tp or (MODELS[kind[len(REAL):]].engine_tp if real else 2)
        for vocab in ([0] if real else args.vocab):
            for sampling in args.sampling:
                if real:  # B unrelated requests' rows: a seeded draw from the file, the same for every B
                    rows = real_rows(kind, args.rows_dir, SAMPLINGS[sampling][0])
                    pick = torch.randperm(rows.shape[0], generator=torch.Generator().manual_seed(args.seed))
                    full = rows[pick[:max(args.batch)]]
                else:
                    rows_needed = max(args.batch)
                    full = (realistic_logits(rows_needed, vocab, args.entropy, seed=args.seed) if kind == "realistic"
                            else flat_logits(rows_needed, vocab, seed=args.seed))
                for batch in args.batch:
                    logits = full[:batch].contiguous()
                    shape = Shape(logits.shape[1], kind, sampling, batch)
                    results.append(_one_shape(shape, logits, args, tp, engines, nucleus_sizes))
                    print(_line(results[-1]), file=sys.stderr)
    return {"config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items()
                       if k not in ("out", "rows_dir")} | {"rows_dir": str(args.rows_dir)}
            | {"entropy": "measured" if args.entropy is None else args.entropy}, "engines": engines, "results": results}


def _one_shape(shape: Shape, logits: Any, args: argparse.Namespace, tp: int, engines: dict[str, str],
               nucleus_sizes: Callable[..., Any]) -> dict[str, Any]:
    variants, replay = gatherwise_variants(logits, shape.sampling, tp)
    for engine, state in engines.items():
        if state == "measured":
            variants[engine] = engine_variant(engine, logits, shape.sampling)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for i in range(args.warmup + args.iters):
        for name, (fn, inputs) in variants.items():  # interleaved: every variant once per round
            x = inputs()
            t0 = time.perf_counter_ns()
            fn(x)
            elapsed = time.perf_counter_ns() - t0
            if i >= args.warmup:
                times[name].append(elapsed / 1e6)
    t, _, p, _ = SAMPLINGS[shape.sampling]
    kept = nucleus_sizes(logits, t, p if p < 1.0 else 0.95)
    median = {name: statistics.median(ms) for name, ms in times.items()}
    base = median["gatherwise/all_gather"]
    return {"vocab": shape.vocab, "logits": shape.logits, "sampling": shape.sampling, "batch": shape.batch, "tp": tp,
            "median_ms": median, "ms": times, "ratio_vs_gatherwise": {name: v / base for name, v in median.items()},
            "sharded_fallback_rows": int(replay.last.fallback_rows), "sharded_exchange_bytes":
            int(replay.last.exchange_bytes), "sharded_resolve_bytes": int(replay.last.resolve_bytes),
            "nucleus": {"temperature": t, "top_p": p if p < 1.0 else 0.95, "mean": float(kept.double().mean()),
                        "min": int(kept.min()), "max": int(kept.max())}}


def _line(r: dict[str, Any]) -> str:
    cells = "  ".join(f"{name} {ms:8.3f}" for name, ms in r["median_ms"].items())
    return f"V={r['vocab']:<6} {r['logits']:<9} {r['sampling']:<5} B={r['batch']:<3} {cells} ms"


def format_table(doc: dict[str, Any]) -> str:
    names = list(doc["results"][0]["median_ms"]) if doc["results"] else []
    engines = [n for n in names if not n.startswith("gatherwise/")]
    head = ["vocab", "logits", "sampling", "B", "nucleus"] + [f"{n} ms" for n in names] + \
        [f"{e}/gw" for e in engines] + [f"{e}/gw-sharded" for e in engines] + ["fallback"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in doc["results"]:
        med = r["median_ms"]
        cells = [str(r["vocab"]), r["logits"], r["sampling"], str(r["batch"]), f"{r['nucleus']['mean']:.0f}"]
        cells += [f"{med[n]:.2f}" for n in names]
        cells += [f"{med[e] / med['gatherwise/all_gather']:.1f}x" for e in engines]
        cells += [f"{med[e] / med['gatherwise/sharded']:.1f}x" for e in engines]
        cells.append(f"{r['sharded_fallback_rows']}/{r['batch']}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["vocab"], r["logits"], r["sampling"]) for r in doc["results"]})
    cols = 3
    rows_ = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows_, cols, figsize=(5 * cols, 3.6 * rows_), squeeze=False)
    for ax, (vocab, logits, sampling) in zip(axes.flat, panels, strict=False):
        shape = [r for r in doc["results"] if (r["vocab"], r["logits"], r["sampling"]) == (vocab, logits, sampling)]
        for name in shape[0]["median_ms"]:
            ax.plot([r["batch"] for r in shape], [r["median_ms"][name] for r in shape], marker="o", label=name)
        ax.set(xscale="log", yscale="log", xlabel="batch rows", ylabel="ms per call (median)",
               title=f"V={vocab} {logits} {sampling}")
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if panels:
        axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.entropy is not None and not args.entropy > 0.0:
        build_parser().error(f"--entropy must be > 0, got {args.entropy}")
    import torch

    t0 = time.perf_counter()
    doc = measure(args)
    doc["env"] = {"torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
                  "cpu_count": os.cpu_count(), "threads": args.threads, "load_avg_1m_at_end": os.getloadavg()[0],
                  "seconds": round(time.perf_counter() - t0, 1), "command": "gatherwise bench sampler " +
                  " ".join(sys.argv[3:] if argv is None else argv)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    plot(doc, args.out / "sampler.png")
    print(format_table(doc))
    print(f"# engines: {doc['engines']}")
    print(f"# wrote {args.out}/results.json, sampler.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
