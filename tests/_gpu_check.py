"""scripts/gpu_check.py loaded from its file: a checkout tool, run by scripts/gpu_check.sh, not an installed module."""

from __future__ import annotations

import importlib.util
import sys

from tests._repo import ROOT

PATH = ROOT / "scripts" / "gpu_check.py"


def _load():
    if "gpu_check" in sys.modules:
        return sys.modules["gpu_check"]
    spec = importlib.util.spec_from_file_location("gpu_check", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


gpu_check = _load()
