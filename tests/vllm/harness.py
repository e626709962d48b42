"""Run vLLM engines as real subprocesses for the vLLM tests, one engine at a time."""

from __future__ import annotations

from tests._engine_harness import clean_env, run_engine_process

ENGINE_TIMEOUT_S = 600
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
# What a vLLM run leaves in /dev/shm when it kills its workers, or is killed itself: its shared-memory segments
# (its message queues are Python shared memory, `psm_*`).
VLLM_SHM_LEFTOVERS = ("vllm_dist_*", "psm_*", "sem.mp-*")


def base_env(**extra: str) -> dict[str, str]:
    return clean_env(**VLLM_ENV, **extra)


def run_engine(model: str, env: dict[str, str], *args: str, module: str = "tests.vllm.engine_run",
               timeout_s: float = ENGINE_TIMEOUT_S) -> dict:
    """One run of `module` (tests.vllm.engine_run, or another run module of tests/vllm) in its own process;
    returns its JSON result."""
    return run_engine_process(module, model, env, args, timeout_s=timeout_s, shm_leftovers=VLLM_SHM_LEFTOVERS)
