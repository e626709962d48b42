"""Run SGLang engines as real subprocesses for the SGLang tests, one engine at a time."""

from __future__ import annotations

import json
import os

from gatherwise.bench.serve.engine_spec import core_per_rank
from gatherwise.bench.serve.sglang_engine import SGLANG_ENV as BENCH_SGLANG_ENV
from tests._engine_harness import clean_env, run_engine_process

ENGINE_TIMEOUT_S = 900
# SGLang on a CPU-only machine as the serving benchmark runs it, with one OpenMP core per TP rank (its NUMA check
# refuses TP=2 on one node otherwise).
SGLANG_ENV = {**BENCH_SGLANG_ENV, "SGLANG_CPU_OMP_THREADS_BIND": core_per_rank(2)}
# What an SGLang run leaves in /dev/shm when it kills its own schedulers at shutdown: load-snapshot slots
# (managers/load_snapshot.py), its shared-memory message queues, and the named semaphores of killed processes.
SGLANG_SHM_LEFTOVERS = ("sglang_loads_*", "sgl_shm_mq_*", "sem.mp-*")


def base_env(**extra: str) -> dict[str, str]:
    return clean_env(**{**SGLANG_ENV, **extra})


def run_engine(model: str, env: dict[str, str], *args: str, module: str = "tests.sglang.engine_run") -> dict:
    """One engine run (`module`: tests.sglang.engine_run, or another run of the same shape) in its own process;
    returns its JSON result."""
    result = run_engine_process(module, model, env, args, timeout_s=ENGINE_TIMEOUT_S,
                                shm_leftovers=SGLANG_SHM_LEFTOVERS)
    dump = os.environ.get("GATHERWISE_SGLANG_DUMP")  # a directory: keep each run's result for a closer look
    if dump:
        with open(os.path.join(dump, f"engine-run-{os.getpid()}-{len(os.listdir(dump))}.json"), "w") as f:
            json.dump(result, f)
    return result


def phase_calls(result: dict, rank: str, phase: str) -> list[list[int]]:
    """Ring records of one phase of a run (call_index in (end of the previous phase, end of this one])."""
    order = list(result["marks"])
    end = result["marks"][phase]
    start = result["marks"][order[order.index(phase) - 1]] if order.index(phase) else -1
    return [c for c in sorted(result["rings"][rank]["calls"]) if start < c[0] <= end]
