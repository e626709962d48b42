"""One benchmark of one engine on one checkpoint: every configuration started in interleaved order, each driven
through every cell by the engine's own client, with the sidecar's counters scraped around each client run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from gatherwise.bench.serve.cells import Cell
from gatherwise.bench.serve.configurations import CONFIGURATIONS, Configuration
from gatherwise.bench.serve.engine_spec import LOCAL_HOST, SERVED_MODEL_NAME, EngineSpec, NodeRank, Workload
from gatherwise.bench.serve.load_wait import wait_for_load
from gatherwise.bench.serve.logits_share import logits_share
from gatherwise.bench.serve.node_servers import ENGINE_PORT, NODE_SHM_DIR, NodeServers
from gatherwise.bench.serve.process_cpu import CpuSnapshot, cores_busy
from gatherwise.bench.serve.real_prompts import RealPrompts
from gatherwise.bench.serve.server_process import ServerProcess
from gatherwise.bench.serve.sidecar_link import SidecarLink
from gatherwise.free_port import free_port

CLIENT_TIMEOUT_S = 1800.0
LENGTH_MARGIN = 64  # a random prompt re-encoded by the client may come out a few tokens longer
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # no hub here; everything is local
DECISIONS_LIMIT = 256
WARMUP_SEED_OFFSET = 1000  # warm-up round r draws its prompts with seed + this + r
IN_START_SEED_OFFSET = 2000  # the in-start comparison's round r draws its prompts with seed + this + r
# after the measured round of an auto configuration (auto): pinned, pinned, auto again, so A B B A in one start
IN_START_ROUNDS = ("pinned", "pinned", "auto")


@dataclass(frozen=True)
class ServeBench:
    engine: EngineSpec
    model: Path
    cells: list[Cell]
    workload: Workload
    python: str
    work_dir: Path  # client result files and server logs
    max_load: float | None
    max_load_wait_s: float
    warmup_rounds: int  # every configuration: rounds of every cell before the measured one, prompts of their own
    nodes: int = 1  # 2: one rank on each of two nodes of this host (node_servers.py), the network already up
    tp: int = 2
    prompts: RealPrompts | None = None  # real text (a trained model's), else the engine's random dataset
    auto_against: str | None = None  # a mode auto configurations are also measured pinned to, in the same start

    @property
    def context_len(self) -> int:
        return self.workload.input_len + self.workload.output_len + LENGTH_MARGIN

    @property
    def max_total_tokens(self) -> int:
        return max(2048, max(c.concurrency for c in self.cells) * self.context_len)


def server_environment(engine: EngineSpec, tp: int) -> dict[str, str]:
    """What every server start of the engine at TP=`tp` runs with: this process's environment without
    GATHERWISE_*, the engine's CPU defaults where unset, its CPU settings, and no hub."""
    env = {**engine.env_defaults(tp), **{k: v for k, v in os.environ.items() if not k.startswith("GATHERWISE_")}}
    env.update(engine.env, **engine.tp_env(tp), **OFFLINE)
    return env


def _environment(bench: ServeBench, conf: Configuration, shm_dir: str) -> dict[str, str]:
    """The server's environment, with gatherwise on only where the configuration says."""
    return {**server_environment(bench.engine, bench.tp), **conf.environment(shm_dir)}


def _warm_up(url: str) -> None:
    """One short greedy request: the engines' first step installs gatherwise's hooks (the sidecar attaches then)."""
    reply = httpx.post(f"{url}/v1/completions", timeout=600,
                       json={"model": SERVED_MODEL_NAME, "prompt": "warm up", "max_tokens": 4, "temperature": 0.0})
    reply.raise_for_status()


def phases(bench: ServeBench, auto: bool = False) -> list[tuple[str, Workload]]:
    """(phase, workload) in order, the same for every configuration: warm-up rounds, then the measured pass. A
    server's first rounds at a batch shape run slower than its later ones, so every configuration gets the same
    history before it is measured; auto is on from the first warm-up round, which is where it learns. Warm-up
    prompts are drawn with seeds of their own: with the measured pass's prompts an engine's prefix cache would
    serve the measured prefills from cache.

    An `auto` configuration with `bench.auto_against` then runs IN_START_ROUNDS, each with prompts of its own:
    auto against the pinned mode within one server start, in A B B A order, where the spread between two starts
    of one configuration (5-24 % on a shared 2-core host) cannot hide a difference of a few per cent."""
    warmup = [("warmup", replace(bench.workload, seed=bench.workload.seed + WARMUP_SEED_OFFSET + r))
              for r in range(bench.warmup_rounds)]
    in_start = [(phase, replace(bench.workload, seed=bench.workload.seed + IN_START_SEED_OFFSET + r))
                for r, phase in enumerate(IN_START_ROUNDS)] if auto and bench.auto_against else []
    return [*warmup, ("measured", bench.workload), *in_start]


def real_prompts(bench: ServeBench, round_index: int, cell: Cell) -> list[str] | None:
    """The cell's prompts in round `round_index` when the benchmark runs real text: a range of the pool of its own
    (rounds after one another, cells in order within a round)."""
    if bench.prompts is None:
        return None
    per_round = sum(c.num_prompts for c in bench.cells)
    start = round_index * per_round + sum(c.num_prompts for c in bench.cells[:bench.cells.index(cell)])
    return bench.prompts.draw(bench.workload.seed, start, cell.num_prompts)


def _run_client(bench: ServeBench, server: ServerProcess | NodeServers, cell: Cell, workload: Workload,
                result_file: Path, prompts: list[str] | None) -> dict[str, Any]:
    command = bench.engine.client_command(bench.python, bench.model, server.host, server.port, cell, workload,
                                          result_file, prompts)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATHERWISE_")}
    env.update(OFFLINE)
    proc = subprocess.run(command, env=env, cwd=bench.work_dir, capture_output=True, text=True,
                          timeout=CLIENT_TIMEOUT_S)
    if proc.returncode != 0 or not result_file.is_file():
        raise RuntimeError(f"the {bench.engine.name} client failed (rc {proc.returncode}) for {cell.key}:\n"
                           + (proc.stdout + proc.stderr)[-6000:])
    result = bench.engine.read_result(result_file)
    if result.completed != cell.num_prompts:
        raise RuntimeError(f"{cell.key}: {result.completed} of {cell.num_prompts} requests completed:\n"
                           + (proc.stdout + proc.stderr)[-4000:])
    return {"result": result, "client_command": command}


def run_configuration(bench: ServeBench, name: str, pass_index: int) -> dict[str, Any]:
    """One server start of configuration `name`: warm-up rounds over every cell, then every cell measured, then
    the sidecar's decisions. Returns the run's record; generated texts under "outputs"."""
    conf = CONFIGURATIONS[name]
    load = wait_for_load(bench.max_load, bench.max_load_wait_s)
    print(f"[bench serve] {bench.engine.name} {name} (pass {pass_index}): starting, load average {load:.2f}",
          file=sys.stderr)
    tag = f"{name}-p{pass_index}"
    sidecar: SidecarLink | None = None
    server: ServerProcess | NodeServers | None = None
    shm_dir: str | None = None
    record: dict[str, Any] = {"configuration": name, "pass": pass_index, "load_avg_1m_at_start": round(load, 2),
                              "cells": [], "outputs": {}}
    try:
        if bench.nodes > 1:
            server = _start_nodes(bench, conf, tag)
            record["server_command"] = server.commands
            record["server_node_env"] = server.node_envs  # on top of results.json's server_env, per node
            if conf.plugin:
                sidecar = server.sidecars()
        else:
            shm_dir = tempfile.mkdtemp(prefix="gatherwise-bench-serve-",
                                       dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
            if conf.plugin:
                sidecar = SidecarLink.start(shm_dir, bench.work_dir / f"sidecar-{tag}.yaml")
            port = free_port()
            command = bench.engine.server_command(bench.python, bench.model, LOCAL_HOST, port, bench.context_len,
                                                  bench.max_total_tokens, tp=bench.tp)
            server = ServerProcess(command, _environment(bench, conf, shm_dir), port,
                                   bench.work_dir / f"server-{tag}.log", bench.engine.shm_leftovers)
            record["server_command"] = command
        record["server_ready_s"] = round(server.wait_ready(), 1)
        # the processes of a one-node server's session (a group across nodes runs its own in other namespaces)
        engine_session = server.proc.pid if isinstance(server, ServerProcess) else None
        sidecar_pid = sidecar.pid if sidecar else None
        _warm_up(server.url)
        if sidecar is not None:
            record["engine"] = sidecar.wait_attached()
            if conf.auto:
                record["auto_put_time"] = time.time()
                record["auto_put"] = sidecar.put_mode({"mode": "auto"})
        for round_index, (phase, workload) in enumerate(phases(bench, conf.auto)):
            if sidecar is not None and phase in IN_START_ROUNDS:
                # every bucket pinned for a pinned round, released to the policy for the auto round after it
                mode = bench.auto_against if phase == "pinned" else "auto"
                puts = record.setdefault("in_start_puts", [])
                if not puts or puts[-1]["mode"] != mode:
                    reply = sidecar.put_mode({"mode": mode})
                    puts.append({"mode": mode, "time": time.time(),
                                 **{k: reply.get(k) for k in ("applied", "seq", "apply_call", "decision")}})
            for cell in bench.cells:
                before = sidecar.metrics_texts() if sidecar else None
                cpu_before = CpuSnapshot.take(engine_session, sidecar_pid)
                started = time.monotonic()
                ran = _run_client(bench, server, cell, workload,
                                  bench.work_dir / f"client-{tag}-{phase}{round_index}-{cell.key}.json",
                                  real_prompts(bench, round_index, cell))
                wall_s = time.monotonic() - started
                result = ran["result"]
                cpu = cores_busy(cpu_before, CpuSnapshot.take(engine_session, sidecar_pid), result.duration_s, wall_s)
                entry = {"phase": phase, "seed": workload.seed, "cell": cell.key, "sampling": cell.sampling.name,
                         "concurrency": cell.concurrency, "num_prompts": cell.num_prompts,
                         "client_wall_s": round(wall_s, 1), "cpu_cores": cpu, **result.summary(),
                         "logits_path": logits_share(before, sidecar.metrics_texts(), result.duration_s)
                         if sidecar and before is not None else None}
                record["cells"].append(entry)
                if phase == "measured":
                    record["outputs"][cell.key] = result.generated_texts
                print(f"[bench serve]   {phase} {cell.key}: {result.output_throughput:.1f} tok/s, "
                      f"TPOT p99 {result.latencies_ms['tpot_p99']:.1f} ms", file=sys.stderr)
        if sidecar is not None:
            record["mode"] = sidecar.get("/v1/mode")
            if conf.auto:
                record["decisions"] = sidecar.get("/v1/decisions", limit=DECISIONS_LIMIT)["decisions"]
                record["stats"] = sidecar.get("/v1/stats")
    finally:
        if server is not None:
            record["server_exit"] = server.stop()
        if sidecar is not None:
            sidecar.stop()
        if shm_dir is not None:
            shutil.rmtree(shm_dir, ignore_errors=True)
    return record


def _start_nodes(bench: ServeBench, conf: Configuration, tag: str) -> NodeServers:
    """Node 0's server and node 1's share of the group, each in its node, gatherwise on both where `conf` says."""
    def command_for(node: NodeRank) -> list[str]:
        return bench.engine.server_command(bench.python, bench.model, node.address, ENGINE_PORT, bench.context_len,
                                           bench.max_total_tokens, node)

    return NodeServers(bench.engine, command_for, _environment(bench, conf, NODE_SHM_DIR), conf.plugin,
                       bench.work_dir, tag)
