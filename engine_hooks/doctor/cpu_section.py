"""The doctor's CPU part: the settings that decide speed on a CPU host, with the engines' own conditions.

- OpenMP's wait policy: libgomp's default lets a rank's idle OpenMP threads spin on cores another rank needs
  (docs/sglang.md, "On a CPU host"); libgomp reads it when torch loads, so only the environment can set it.
- vLLM's CPU shared-memory communicator (`CpuCommunicator`): on x86, ARM, POWER and s390x when vLLM's kernel
  library registers `init_shm_manager` and the TP group's ranks agree on one group name (`VLLM_DIST_IDENT`, set
  by the CPU worker from the init method). On x86 vLLM loads `vllm._C` (AVX-512 with BF16) or `vllm._C_AVX512`
  (AVX-512), which hold the shared-memory ops, else `vllm._C_AVX2`, which does not: without AVX-512 every
  collective takes torch.distributed (gloo).
- SGLang's shared-memory all_gather (`is_shm_available`): AMX tiles with SGLang's CPU kernel library
  (`sgl_kernel` registering `convert_weight_packed`), or an arm64 host; a bf16/fp16/fp32 tensor; every rank on
  one node. Otherwise torch.distributed (gloo).
"""

from __future__ import annotations

import importlib.util
import os
import platform
from typing import Any

from gatherwise.engine_hooks.doctor.section import Section

OMP_ENV = ("OMP_WAIT_POLICY", "VLLM_CPU_OMP_THREADS_BIND", "SGLANG_CPU_OMP_THREADS_BIND")
VLLM_SHM_ARCHES = ("x86_64", "amd64", "aarch64", "arm64", "ppc64le", "ppc64", "s390x")


def cpu_section(engines: set[str]) -> Section:
    """`engines`: the installed ones ("vllm", "sglang")."""
    section = Section("CPU speed settings")
    policy = os.environ.get("OMP_WAIT_POLICY")
    advice = "" if (policy or "").upper() == "PASSIVE" else \
        " (PASSIVE where TP ranks share cores: idle OpenMP threads then sleep instead of spinning)"
    section.add(f"OMP_WAIT_POLICY={policy or '(unset: libgomp lets idle threads spin)'}{advice}")
    for name in OMP_ENV[1:]:
        if name in os.environ:
            section.add(f"{name}={os.environ[name]}")
    torch = _torch()
    if torch is None:
        section.add("torch is not importable here: the vector units cannot be read")
        return section
    machine = platform.machine().lower()
    if "vllm" in engines:
        section.add(f"vLLM CPU shared-memory communicator: {_vllm_shm(torch, machine)}")
    if "sglang" in engines:
        section.add(f"SGLang shared-memory all_gather: {_sglang_shm(torch, machine)}")
    return section


def _torch() -> Any:
    try:
        import torch
    except Exception:
        return None
    return torch


def _vllm_shm(torch: Any, machine: str) -> str:
    if machine not in VLLM_SHM_ARCHES:
        return f"off ({machine} is none of the architectures vLLM enables it on); collectives take gloo"
    if machine not in ("x86_64", "amd64"):
        return "possible (vLLM's kernel library on this architecture; ranks must agree on one group name)"
    if not torch.cpu._is_avx512_supported():
        return "off: no AVX-512, so vLLM loads vllm._C_AVX2, which has no shared-memory ops; collectives take gloo"
    library = "vllm._C" if torch.cpu._is_avx512_bf16_supported() else "vllm._C_AVX512"
    return (f"possible: AVX-512, so vLLM loads {library}, which has the shared-memory ops; on when the TP ranks "
            "agree on one group name (vLLM logs 'CPU SHM communicator disabled' when they do not)")


def _sglang_shm(torch: Any, machine: str) -> str:
    if machine in ("aarch64", "arm64"):
        return "on for bf16/fp16/fp32 logits with every rank on one node (arm64 host)"
    amx = bool(torch.cpu._is_amx_tile_supported())
    kernel = _sgl_kernel_cpu_ops(torch)
    if amx and kernel:
        return "on for bf16/fp16/fp32 logits with every rank on one node (AMX tiles, sgl_kernel's CPU ops)"
    why = "no AMX tiles" if not amx else "sgl_kernel has no CPU ops (convert_weight_packed) here"
    return f"off ({why}); collectives take gloo"


def _sgl_kernel_cpu_ops(torch: Any) -> bool:
    if importlib.util.find_spec("sgl_kernel") is None:
        return False
    try:  # as SGLang's own check: a CUDA build of the kernels fails to import or registers no CPU op
        import sgl_kernel  # noqa: F401

        return hasattr(torch.ops.sgl_kernel, "convert_weight_packed")
    except Exception:
        return False
