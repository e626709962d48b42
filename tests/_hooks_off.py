"""A real engine-side process whose hooks are off: it publishes its hooks-off notice through the adapters' own
reporter (engine_hooks.adapters.hooks_off), as vLLM's and SGLang's workers do when their hooks refuse, and lives
until its stdin closes."""

from __future__ import annotations

import os
import subprocess
import sys

from tests._sidecar import ROOT

DETAIL = "vLLM builds Model Runner V2 (vllm.v1.worker.gpu.model_runner.GPUModelRunner), which gatherwise does not hook"
# A process that reports its hooks off twice for one reason (once said is enough) and waits for stdin to close.
REPORTER = f"""
import logging, os, sys
from gatherwise.engine_hooks.adapters.hooks_off import report_hooks_off
from gatherwise.config import load_config
logging.basicConfig(level=logging.INFO)
log = logging.getLogger("gatherwise.vllm")
config = load_config(None)
for _ in range(2):
    report_hooks_off(log, "vLLM", "unsupported_feature", {DETAIL!r}, config, 0)
print("published", flush=True)
sys.stdin.read()
"""


def start_reporter(shm: str) -> subprocess.Popen:
    env = {**os.environ, "GATHERWISE_ENGINE_SHM_DIR": shm, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", REPORTER], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None  # both are PIPEs
    assert proc.stdout.readline().strip() == "published", proc.stderr.read()
    return proc


def stop(proc: subprocess.Popen) -> str:
    _, err = proc.communicate(timeout=30)
    return err
