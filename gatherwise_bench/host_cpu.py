"""What CPU a benchmark ran on: its model and the vector units CPU inference kernels pick their code paths by.
Hosts with and without them serve at different speeds, so a result is only comparable with results from the same
kind of host."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")


def cpu_description() -> dict[str, Any]:
    """The first processor's model and vector units, from /proc/cpuinfo where there is one."""
    try:
        first = Path("/proc/cpuinfo").read_text().split("\n\n", 1)[0]
    except OSError:
        return {"cpu_model": platform.processor() or None}
    fields = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in first.splitlines() if ":" in line)}
    flags = set(fields.get("flags", "").split())
    return {"cpu_model": fields.get("model name"), "cpu_vector_units": [f for f in VECTOR_FLAGS if f in flags]}
