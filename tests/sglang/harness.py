"""Run SGLang engines as real subprocesses for the SGLang tests, one engine at a time."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

from tests._engine_harness import clean_env

REPO = Path(__file__).resolve().parents[2]
ENGINE_TIMEOUT_S = 900
# SGLang on a CPU-only machine: its CPU engine, one OpenMP core per TP rank (its NUMA check refuses TP=2 on one
# node otherwise), and no pynccl (the CUDA torch build would try to load libnccl; a missing path turns it off).
SGLANG_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "SGLANG_CPU_OMP_THREADS_BIND": "0|1",
              "SGLANG_NCCL_SO_PATH": "/nonexistent/libnccl.so"}


def base_env(**extra: str) -> dict[str, str]:
    return clean_env(**SGLANG_ENV, **extra)


def build_model(out_dir: str) -> str:
    subprocess.run([sys.executable, str(REPO / "scripts" / "build_tiny_llama.py"), out_dir], check=True,
                   capture_output=True, timeout=300)
    return out_dir


# What an SGLang run leaves in /dev/shm when it kills its own schedulers at shutdown: load-snapshot slots
# (managers/load_snapshot.py), its shared-memory message queues, and the named semaphores of killed processes.
_SGLANG_SHM_LEFTOVERS = ("sglang_loads_*", "sgl_shm_mq_*", "sem.mp-*")


def _sglang_shm_files() -> set[str]:
    return {path for pattern in _SGLANG_SHM_LEFTOVERS for path in glob.glob(f"/dev/shm/{pattern}")}


def run_engine(model: str, env: dict[str, str], *args: str) -> dict:
    """One engine_run process; returns its JSON result, with the process's log under "log". Removes the
    /dev/shm files it left (SGLang kills its schedulers at shutdown, before they unlink them)."""
    before = _sglang_shm_files()
    try:
        proc = subprocess.run([sys.executable, "-m", "tests.sglang.engine_run", "--model", model, *args],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=ENGINE_TIMEOUT_S)
    finally:
        for leftover in _sglang_shm_files() - before:
            try:
                os.unlink(leftover)
            except OSError:
                pass
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stdout + proc.stderr)[-8000:]
        raise AssertionError(f"engine run {args} failed (rc {proc.returncode}):\n{tail}")
    result = json.loads(lines[-1][len("RESULT "):])
    result["log"] = proc.stderr
    dump = os.environ.get("GATHERWISE_SGLANG_DUMP")  # a directory: keep each run's result for a closer look
    if dump:
        with open(os.path.join(dump, f"engine-run-{os.getpid()}-{len(os.listdir(dump))}.json"), "w") as f:
            json.dump(result, f)
    return result
