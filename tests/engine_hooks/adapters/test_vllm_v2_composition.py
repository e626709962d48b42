"""Model Runner V2's hooks stand without V1's: importing them loads no V1 module of the adapter (vLLM releases
without the V1 runner need exactly this), and they share the worker's state by holding it, not by inheriting it."""

from __future__ import annotations

import subprocess
import sys


def test_v2_hooks_import_no_v1_module() -> None:
    code = ("import sys; import gatherwise.engine_hooks.adapters.vllm.v2_step; "
            "print(sorted(m for m in sys.modules if m.startswith('gatherwise.engine_hooks.adapters.vllm.v1')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_v2_hooks_hold_the_worker() -> None:
    from gatherwise.config import GatherwiseConfig
    from gatherwise.engine_hooks.adapters.vllm.v1_step import V1StepHooks
    from gatherwise.engine_hooks.adapters.vllm.v2_step import V2StepHooks
    from gatherwise.engine_hooks.adapters.vllm.worker import VllmWorker

    worker = VllmWorker(GatherwiseConfig())
    v1, v2 = V1StepHooks(worker), V2StepHooks(worker)
    assert v1.worker is v2.worker is worker
    assert V1StepHooks not in V2StepHooks.__mro__ and VllmWorker not in V2StepHooks.__mro__
