"""`gatherwise engine`: the TP engine with the gatherwise hooks under a synthetic decode load, or real traffic.

    gatherwise engine --tp P [--workload mixed|fixed:ROWS] [--sampling greedy|mixed] [--duration SECONDS]
                      [--checkpoint DIR [--max-new-tokens N]]
                      [--shm-dir DIR] [--config FILE] [--nnodes N --node-rank K --dist-init-addr HOST:PORT]

Without a checkpoint, each call is one synthetic decode step of the seeded random model. With `--checkpoint` (a
trained model, e.g. `gatherwise models fetch smollm2`), rounds of real questions are answered by that model
(tp_engine/chat_load.py): B requests per round, B drawn as the workload says (mixed: 1..16 here, a real model's
rounds being longer), and rank 0 publishes each round's first answer for the page to show.

Runs until the duration ends or the parent gets SIGINT/SIGTERM. Ranks must stop at the same call (a rank that
stops alone leaves the others blocked in a collective), so rank 0 decides and broadcasts "go on / stop" every
few calls; the ranks themselves ignore SIGINT and SIGTERM (Ctrl-C and `timeout` signal the whole process group); a
rank whose parent died stops by itself. Across nodes (one command per node, as `gatherwise generate`) rank 0's
node decides: the other nodes run until rank 0 stops them, and each node's sidecar reads its own node's ranks.
On exit rank 0 removes the engine's shared-memory directory (install_hooks' close()).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gatherwise.config import GatherwiseConfig
from gatherwise.shm_format.ring import engine_dir_name
from gatherwise.tp_engine.launch import MAX_LOCAL_RANKS
from gatherwise.tp_engine.nodes import add_node_args, nodes_from_args

MIXED_MAX_ROWS = 64
CHAT_MAX_ROWS = 16  # the mixed workload's largest round of real requests: rounds of 64 answers last minutes on a CPU
FIXED_MAX_ROWS = 1024  # the largest batch `fixed:ROWS` takes
CALLS_PER_CHECK = 8  # logits calls between two stop checks (one tiny broadcast each)
MIXED_DWELL = 32  # calls at one batch size before the mixed workload moves on
# Sampling kinds given to the rows of every call, row j taking entry j mod len: "mixed" has one row of each kind
# (greedy, top-k, top-p, temperature only), so every mode runs each of its code paths and every op shows up.
SAMPLING_MIXES: dict[str, tuple[dict[str, Any], ...]] = {
    "greedy": ({},),
    "mixed": ({}, {"temperature": 0.8, "top_k": 50}, {"temperature": 0.8, "top_p": 0.9}, {"temperature": 1.0}),
}


@dataclass(frozen=True)
class LoadSpec:
    tp: int
    workload: str  # "mixed" | "fixed:ROWS"
    duration: float | None
    config: GatherwiseConfig  # engine.shm_dir already overridden
    vocab: int = 32000
    device: str = "cpu"
    seed: int = 0
    sampling: str = "greedy"  # a key of SAMPLING_MIXES
    checkpoint: str | None = None  # a trained model: real questions answered instead of synthetic calls
    max_new_tokens: int = 48  # of each answer (with a checkpoint)


@dataclass(frozen=True)
class RankSummary:
    rank: int
    engine_id: str
    calls: int
    seconds: float



def stop_on_every_rank(comm: Any, flag: Any, rank0_says_stop: Callable[[], bool]) -> bool:
    """Rank 0 decides whether to stop; one tiny broadcast of `flag` (a one-element int64 tensor) tells every rank,
    so all ranks leave at the same call and none waits alone in a later collective."""
    if comm.rank == 0:
        flag.fill_(int(rank0_says_stop()))
    comm.broadcast(flag)
    return bool(flag.item())

def parse_workload(text: str) -> str:
    if text == "mixed":
        return text
    rows = text.removeprefix("fixed:")
    if rows != text and rows.isdigit() and 1 <= int(rows) <= FIXED_MAX_ROWS:
        return text
    raise argparse.ArgumentTypeError(f"invalid workload {text!r}: expected mixed or fixed:ROWS (1..{FIXED_MAX_ROWS})")


def batch_sizes(workload: str, seed: int, dwell: int = MIXED_DWELL, largest: int = MIXED_MAX_ROWS) -> Iterator[int]:
    """Endless batch sizes, identical on every rank. mixed: log-uniform over 1..`largest`, held `dwell` calls."""
    if workload.startswith("fixed:"):
        rows = int(workload[6:])
        while True:
            yield rows
    rng = random.Random(seed)
    while True:
        rows = max(1, min(largest, round(2 ** rng.uniform(0, math.log2(largest)))))
        for _ in range(dwell):
            yield rows


def max_rows(workload: str, largest: int = MIXED_MAX_ROWS) -> int:
    return int(workload[6:]) if workload.startswith("fixed:") else largest


def engine_rank(rank: int, world: int, spec: LoadSpec, stop: Any, parent_pid: int) -> RankSummary:
    # stop: the reading end of a pipe from the parent (multiprocessing Connection)
    """Rank main: model + hooks, then synthetic decode steps until rank 0 says stop."""
    import torch

    from gatherwise.engine_hooks.comm import default_communicator
    from gatherwise.engine_hooks.install import install_hooks, logits_dtype
    from gatherwise.engine_hooks.sampling_params import SamplingParams
    from gatherwise.tp_engine.layers import TPGroup
    from gatherwise.tp_engine.runner import Engine, ModelSpec

    # The parent stops us at a call every rank agrees on; Ctrl-C, `timeout` and systemd signal the whole group.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    tp = TPGroup.from_dist()
    model = ModelSpec(vocab=spec.vocab, checkpoint=spec.checkpoint, compute_dtype="float32",
                      device=spec.device).load(tp)
    vocab = model.config.vocab_size
    comm = default_communicator()
    hooks = install_hooks(comm, vocab=vocab, dtype=logits_dtype(spec.config), device=model.device,
                          config=spec.config, model=Path(spec.checkpoint).name if spec.checkpoint else "random")
    engine_id = engine_dir_name(hooks.engine_id)
    if rank == 0:
        print(f"gatherwise engine {engine_id}: tp={world} workload={spec.workload} "
              f"model={spec.checkpoint or 'random'} shm={spec.config.engine.shm_dir}", flush=True)
    largest = CHAT_MAX_ROWS if spec.checkpoint else MIXED_MAX_ROWS
    engine = Engine(model, hooks.logits_path, max_batch=max_rows(spec.workload, largest))
    flag = torch.zeros(1, dtype=torch.int64, device=model.device)
    params = tuple(SamplingParams(**kind) for kind in SAMPLING_MIXES[spec.sampling])
    if spec.checkpoint:
        from gatherwise.tp_engine.chat_load import ChatLoad

        chat = ChatLoad(engine, spec.checkpoint, params, spec.max_new_tokens,
                        hooks.engine_dir if rank == 0 else None)
        rounds = batch_sizes(spec.workload, spec.seed, dwell=1, largest=CHAT_MAX_ROWS)
        step: Callable[[], object] = lambda: chat.round(next(rounds))
    else:
        sizes = batch_sizes(spec.workload, spec.seed)
        step = lambda: engine.synthetic([next(sizes) for _ in range(CALLS_PER_CHECK)], params,
                                        path=hooks.logits_path)
    t0 = time.monotonic()
    deadline = t0 + spec.duration if spec.duration is not None else float("inf")

    def finished() -> bool:  # rank 0's view: the parent asked to stop or is gone, or the duration ran out
        return stop.poll() or time.monotonic() >= deadline or os.getppid() != parent_pid

    try:
        while True:
            step()
            if stop_on_every_rank(comm, flag, finished):
                break
    finally:
        hooks.close()
    return RankSummary(rank, engine_id, hooks.logits_path.call_index, time.monotonic() - t0)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gatherwise engine",
                                description="Run the TP engine with gatherwise hooks under a synthetic load, or "
                                            "answering real questions with a trained model.")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel size P (ranks of the whole group)")
    p.add_argument("--workload", type=parse_workload, default="mixed",
                   help="mixed (batch sizes moving across 1..64; 1..16 requests per round with --checkpoint) or "
                        "fixed:ROWS")
    p.add_argument("--sampling", choices=tuple(SAMPLING_MIXES), default="greedy",
                   help="sampling kinds of the rows: greedy, or mixed (greedy, top-k, top-p, temperature in turn)")
    p.add_argument("--duration", type=float, default=None, help="seconds to run (default: until SIGINT/SIGTERM)")
    p.add_argument("--shm-dir", help="where the rings and control block go (default: engine.shm_dir)")
    p.add_argument("--config", help="YAML config file (default: built-in defaults + GATHERWISE_* env)")
    p.add_argument("--vocab", type=int, default=32000, help="vocab of the random model")
    p.add_argument("--checkpoint", default=None,
                   help="a trained model's HF directory (e.g. from `gatherwise models fetch smollm2`): real questions "
                        "answered in rounds instead of synthetic calls")
    p.add_argument("--max-new-tokens", type=int, default=48, help="tokens of each answer (with --checkpoint)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu (gloo) or cuda (NCCL)")
    p.add_argument("--seed", type=int, default=0, help="seed of the mixed workload's batch sizes")
    add_node_args(p)
    return p


def engine_main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 1 <= args.tp <= MAX_LOCAL_RANKS:
        parser.error(f"--tp must be in 1..{MAX_LOCAL_RANKS}, got {args.tp}")
    if args.duration is not None and args.duration <= 0:
        parser.error(f"--duration must be > 0, got {args.duration}")
    nodes = nodes_from_args(parser, args, args.tp)
    import multiprocessing as mp

    from gatherwise.config import ConfigError, load_config
    from gatherwise.tp_engine.launch import LaunchError, launch

    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        print(f"gatherwise engine: {exc}", file=sys.stderr)
        return 2
    if args.shm_dir:
        cfg = cfg.replace(engine=cfg.engine.replace(shm_dir=args.shm_dir))
    if cfg.telemetry.enabled or cfg.control.enabled:
        from gatherwise.shm_format.private_files import ensure_private_dir

        try:  # refuse an unsafe shm_dir here, with one line, rather than as a traceback from every rank
            ensure_private_dir(cfg.engine.shm_dir)
        except OSError as exc:
            print(f"gatherwise engine: engine.shm_dir: {exc}", file=sys.stderr)
            return 2
    if not 1 <= args.max_new_tokens <= 4096:
        parser.error(f"--max-new-tokens must be in 1..4096, got {args.max_new_tokens}")
    if args.checkpoint is not None:
        from gatherwise.tp_engine.hf_config import load_hf_config

        try:
            load_hf_config(args.checkpoint)
        except (OSError, ValueError) as exc:  # UnsupportedConfig is a ValueError
            parser.error(f"--checkpoint {args.checkpoint}: {exc}")
    spec = LoadSpec(args.tp, args.workload, args.duration, cfg, args.vocab, args.device, args.seed,
                    args.sampling, args.checkpoint, args.max_new_tokens)
    # A pipe, not an Event: no named semaphore to leave in /dev/shm if the whole tree is killed. Rank 0 polls the
    # reading end; a byte, or the end of the pipe when this process dies, both mean stop.
    stop, stop_writer = mp.get_context("spawn").Pipe(duplex=False)

    def request_stop(*_: object) -> None:
        try:
            stop_writer.send_bytes(b"s")
        except OSError:
            pass

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    timeout = (args.duration + 300.0) if args.duration is not None else 30 * 86400.0
    try:
        results = launch(engine_rank, args.tp, spec, stop, os.getpid(), device=args.device, timeout=timeout,
                         nodes=nodes)
    except LaunchError as exc:
        print(f"gatherwise engine: error: {exc}", file=sys.stderr)
        return 1
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    first = results[0]  # this node's first rank
    print(f"gatherwise engine {first.engine_id}: {first.calls} logits calls per rank in {first.seconds:.1f} s "
          f"({first.calls / max(first.seconds, 1e-9):.0f} calls/s)", flush=True)
    return 0
