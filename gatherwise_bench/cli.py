"""`gatherwise bench`: sweep the hooked logits path over rows x vocab x dtype x mode on P ranks.

Prints an nccl-tests style table and writes results.json, crossover.png and one starting-table file per
(vocab, dtype) into --out. Formulas and the timing method: docs/bench.md. Across nodes (`--nnodes`, one command
per node) node 0 writes the report from its own ranks' timings; the other nodes write nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gatherwise.bench.arg_types import at_least, int_list, name_list
from gatherwise.bench.sampling_spec import parse_sampling
from gatherwise.logits_dtypes import LOGITS_DTYPES
from gatherwise.modes import IMPLEMENTED_LABELS, Mode
from gatherwise.tp_engine.nodes import Nodes, add_node_args, nodes_from_args

if TYPE_CHECKING:  # torch-free at import: argument errors come before any heavy import
    from gatherwise.bench.report import SweepResult

DEFAULT_ROWS = "1,2,4,8,16,32,64,128,256"


def _dtype(text: str) -> str:
    if text.lower() not in LOGITS_DTYPES:
        raise ValueError(f"unknown dtype {text!r}: expected one of {', '.join(LOGITS_DTYPES)}")
    return text.lower()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gatherwise bench",
        description="Time the logits path (collectives + sampling + token distribution) per mode on P "
                    "local ranks; print which mode wins where, write results.json, crossover.png and "
                    "starting-table files for the auto policy.")
    p.add_argument("--tp", type=at_least("--tp", 1), default=2, help="ranks (tensor-parallel size), default 2")
    p.add_argument("--vocab", type=int_list("--vocab", 1), default=(32000, 152064),
                   help="comma-separated vocab sizes, default 32000,152064")
    p.add_argument("--rows", type=int_list("--rows", 1), default=int_list("--rows", 1)(DEFAULT_ROWS),
                   help=f"comma-separated batch rows, default {DEFAULT_ROWS}")
    p.add_argument("--dtype", type=name_list("--dtype", _dtype), default=("float32", "bfloat16"),
                   help=f"comma-separated logits dtypes ({', '.join(LOGITS_DTYPES)}), default float32,bfloat16")
    p.add_argument("--modes", type=name_list("--modes", lambda t: Mode.parse(t).label),
                   default=IMPLEMENTED_LABELS, help="comma-separated modes, interleaved in this order; "
                   f"default {','.join(IMPLEMENTED_LABELS)}")
    p.add_argument("--sampling", type=name_list("--sampling", lambda t: parse_sampling(t).label),
                   default=("greedy",), help="comma-separated sampling of every row: greedy, top_k=K, top_p=P, "
                   "temperature=T (temperature 1 with top_k/top_p); default greedy")
    p.add_argument("--logit-scale", type=float, default=1.0,
                   help="logits are scale * N(0, 1); larger is more peaked (top-p nuclei fit the sharded "
                   "candidates), default 1.0")
    p.add_argument("--iters", type=at_least("--iters", 1), default=30, help="timed calls per mode, default 30")
    p.add_argument("--warmup", type=at_least("--warmup", 0), default=3,
                   help="untimed calls per mode before each shape, default 3")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: cuda (NCCL, rank r on cuda:r) when there are >= tp GPUs, else cpu (gloo)")
    p.add_argument("--out", type=Path, default=Path("out/logits_sweep"),
                   help="output directory, default out/logits_sweep")
    p.add_argument("--seed", type=int, default=0, help="seed of the random logits")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds before the sweep is abandoned")
    p.add_argument("--from-results", type=Path, metavar="RESULTS_JSON",
                   help="measure nothing: re-render the table, plot and table files of an earlier results.json")
    add_node_args(p)
    return p


def _pick_device(requested: str, local: int, parser: argparse.ArgumentParser) -> str:
    """`local`: the ranks on this node, one GPU each."""
    if requested == "cpu":
        return "cpu"
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if requested == "cuda" and gpus < local:
        parser.error(f"--device cuda needs {local} GPUs (one per rank), found {gpus}")
    return "cuda" if gpus >= local else "cpu"


def _serve(argv: list[str]) -> int:
    """A real engine's server under load, not the logits path alone."""
    from gatherwise.bench.serve.cli import main as serve_main

    return serve_main(argv)


def _sampler(argv: list[str]) -> int:
    """The sampler alone against the engines' own, no ranks."""
    from gatherwise.bench.sampler import main as sampler_main

    return sampler_main(argv)


# `gatherwise bench NAME ...`; without one of these names, the sweep. Each imports its code only when run, so a
# bad argument of one never waits for another's imports.
SUBCOMMANDS: dict[str, Callable[[list[str]], int]] = {"serve": _serve, "sampler": _sampler}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[2:] if argv is None else argv
    if argv and argv[0] in SUBCOMMANDS:
        return SUBCOMMANDS[argv[0]](argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.from_results is not None:
        if not args.from_results.is_file():
            parser.error(f"--from-results: no such file {args.from_results}")
        from gatherwise.bench.report import load_results

        return _write_outputs(load_results(args.from_results), args.out)
    nodes = nodes_from_args(parser, args, args.tp)

    from gatherwise.bench.launch import local_ranks, run_ranks

    device = _pick_device(args.device, local_ranks(args.tp, nodes), parser)

    # heavy imports only once the arguments are known to be good
    import torch

    from gatherwise.bench.report import SweepResult, find_crossovers, summarize
    from gatherwise.bench.sweep import SweepConfig, sweep_rank

    cfg = SweepConfig(tp=args.tp, vocabs=args.vocab, rows=args.rows, dtypes=args.dtype, modes=args.modes,
                      iters=args.iters, warmup=args.warmup, device=device, seed=args.seed,
                      samplings=args.sampling, logit_scale=args.logit_scale)
    print(f"[bench] tp={cfg.tp} {cfg.backend} on {device}: {len(cfg.vocabs)} vocab x {len(cfg.dtypes)} dtype x "
          f"{len(cfg.samplings)} sampling x {len(cfg.rows)} rows x {len(cfg.modes)} modes, "
          f"{cfg.warmup}+{cfg.iters} calls each", file=sys.stderr)
    t0 = time.perf_counter()
    per_rank = run_ranks(sweep_rank, cfg.tp, cfg, backend=cfg.backend, timeout=args.timeout, nodes=nodes)
    elapsed = time.perf_counter() - t0
    if nodes is not None and nodes.rank != 0:  # rank 0's node writes the report; this one only took part
        print(f"# {nodes.describe(cfg.tp)} done: node 0 writes the report; nothing written here", file=sys.stderr)
        return 0
    shapes = summarize(cfg, per_rank)
    env: dict[str, Any] = {
        "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
        "cpu_count": os.cpu_count(), "threads_per_rank": max(1, (os.cpu_count() or 1) // local_ranks(cfg.tp, nodes)),
        "load_avg_1m_at_end": os.getloadavg()[0], "sweep_seconds": round(elapsed, 1),
        "command": "gatherwise bench " + " ".join(argv)}
    if nodes is not None:
        env["nodes"] = _node_layout(nodes, cfg.tp)
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name(0)
    print(f"# sweep took {elapsed:.1f} s", file=sys.stderr)
    return _write_outputs(SweepResult(cfg, shapes, find_crossovers(shapes), env), args.out)


def _node_layout(nodes: Nodes, tp: int) -> dict[str, Any]:
    """Which ranks ran where, and which of them the timings come from (rank 0's node: one clock)."""
    return {"count": nodes.count, "dist_init_addr": f"{nodes.addr}:{nodes.port}",
            "ranks_by_node": {str(k): list(Nodes(nodes.count, k, nodes.addr, nodes.port).ranks(tp))
                              for k in range(nodes.count)},
            "measured_ranks": list(nodes.ranks(tp)), "measured_on_node": nodes.rank}


def _write_outputs(result: SweepResult, out_dir: Path) -> int:
    from gatherwise.bench.plot import plot_crossover
    from gatherwise.bench.report import format_table, write_results_json
    from gatherwise.bench.starting_table import write_starting_tables

    out_dir.mkdir(parents=True, exist_ok=True)
    tables = write_starting_tables(out_dir, result.config, result.shapes)
    write_results_json(out_dir / "results.json", result, tables)
    plot_crossover(out_dir / "crossover.png", result)
    print(format_table(result))
    print(f"# wrote {out_dir}/results.json, crossover.png, {len(tables)} table file(s)")
    return 0
