"""Run vLLM engines and the sidecar as real subprocesses for the vLLM tests, one engine at a time."""

from __future__ import annotations

import glob
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENGINE_TIMEOUT_S = 600
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATHERWISE_")}
    env.update(VLLM_ENV)
    env.update(extra)
    return env


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


@dataclass
class Sidecar:
    url: str
    token: str
    proc: subprocess.Popen

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_sidecar(shm_dir: str) -> Sidecar:
    """`gatherwise sidecar` on 127.0.0.1, a free port, reading `shm_dir`; mutations need a fresh token."""
    token = secrets.token_hex(16)
    exe = Path(sys.executable).parent / "gatherwise"
    out = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([str(exe), "sidecar", "--host", "127.0.0.1", "--port", "0", "--shm-dir", shm_dir,
                             "--log-level", "warning"], env=base_env(GATHERWISE_API_TOKEN=token),
                            stdout=out, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        out.seek(0)
        found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", out.read())
        if found:
            return Sidecar(found.group(1), token, proc)
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    out.seek(0)
    raise AssertionError(f"the sidecar did not start:\n{out.read()[-3000:]}")


def mode_runs(calls: list[list[int]]) -> list[int]:
    """The modes of a ring's calls in call order, with repeats collapsed: [0, 0, 1, 1, 0] -> [0, 1, 0]."""
    runs: list[int] = []
    for _, mode, *_ in sorted(calls):
        if not runs or runs[-1] != mode:
            runs.append(mode)
    return runs


def metric_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample of `name` in Prometheus text format."""
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels_text, value = line[len(name) + 1:].rsplit("} ", 1)
            labels = dict(re.findall(r'(\w+)="([^"]*)"', labels_text))
            out.append((labels, float(value)))
    return out
