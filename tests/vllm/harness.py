"""Run vLLM engines and the sidecar as real subprocesses for the vLLM tests, one engine at a time."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

from tests._engine_harness import Sidecar, clean_env, metric_samples, mode_runs, start_sidecar

__all__ = ["Sidecar", "base_env", "build_model", "metric_samples", "mode_runs", "run_engine", "start_sidecar"]

REPO = Path(__file__).resolve().parents[2]
ENGINE_TIMEOUT_S = 600
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def base_env(**extra: str) -> dict[str, str]:
    return clean_env(**VLLM_ENV, **extra)


def build_model(out_dir: str) -> str:
    subprocess.run([sys.executable, str(REPO / "scripts" / "build_tiny_llama.py"), out_dir], check=True,
                   capture_output=True, timeout=300)
    return out_dir


def _vllm_shm_files() -> set[str]:
    return set(glob.glob("/dev/shm/vllm_dist_*"))


def run_engine(model: str, env: dict[str, str], *args: str) -> dict:
    """One engine_run process; returns its JSON result. Removes the /dev/shm/vllm_dist_* files it left."""
    before = _vllm_shm_files()
    try:
        proc = subprocess.run([sys.executable, "-m", "tests.vllm.engine_run", "--model", model, *args], cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=ENGINE_TIMEOUT_S)
    finally:
        for leftover in _vllm_shm_files() - before:  # vLLM leaves its shm segments when it kills its workers
            try:
                os.unlink(leftover)
            except OSError:
                pass
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stdout + proc.stderr)[-6000:]
        raise AssertionError(f"engine run {args} failed (rc {proc.returncode}):\n{tail}")
    result = json.loads(lines[-1][len("RESULT "):])
    result["log"] = proc.stderr
    return result
