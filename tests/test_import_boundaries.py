"""Import rules: the sidecar never pulls in torch; the engine hooks never pull in the sidecar's web/telemetry stack.

Each check runs in a fresh interpreter, imports the modules one by one, and names the first one that broke the rule.
Modules are globbed at test time, so new files are covered without editing this test.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENGINE_ONLY_PACKAGES = ("vllm", "sglang")  # adapters for engines that are not installed here

CHECK = """
import importlib, sys
forbidden = {forbidden!r}
optional = {optional!r}
for name in {modules!r}:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] in optional:
            continue
        raise
    bad = sorted(m for m in sys.modules if m.split(".")[0] in forbidden)
    if bad:
        print(f"{{name}} imported {{', '.join(bad[:5])}}")
        sys.exit(1)
print("ok")
"""


def _modules(*patterns: str) -> list[str]:
    names = []
    for pattern in patterns:
        for path in sorted(ROOT.glob(pattern)):
            parts = path.relative_to(ROOT).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return list(dict.fromkeys(names))


def _check(modules: list[str], forbidden: set[str]) -> subprocess.CompletedProcess:
    code = CHECK.format(modules=modules, forbidden=sorted(forbidden), optional=ENGINE_ONLY_PACKAGES)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(150)
def test_sidecar_and_shared_formats_never_import_torch():
    modules = ["engine_hooks", "engine_hooks.modes", "sidecar.ring_reader",
               *_modules("engine_hooks/shm_format/*.py", "sidecar/*.py", "sidecar/**/*.py")]
    assert "engine_hooks.shm_format.ring" in modules and "sidecar.ring_reader" in modules
    result = _check(modules, {"torch"})
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout + result.stderr


@pytest.mark.timeout(150)
def test_engine_hooks_never_import_the_sidecar_stack():
    modules = _modules("engine_hooks/*.py", "engine_hooks/**/*.py")
    assert "engine_hooks.recorder" in modules and "engine_hooks.cuda_timing" in modules
    forbidden = {"fastapi", "uvicorn", "starlette", "prometheus_client", "opentelemetry", "sidecar"}
    result = _check(modules, forbidden)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout + result.stderr


def test_the_checker_notices_a_violation():
    result = _check(["json"], {"json"})
    assert result.returncode == 1 and "json imported json" in result.stdout
