"""Import rules: the core (`gatherwise`) pulls in neither torch nor the web stack; the sidecar never pulls in torch
or the engine hooks; the engine hooks never pull in the sidecar's web/telemetry stack.

Each check runs in a fresh interpreter, imports the modules one by one, and names the first one that broke the rule.
Modules are globbed at test time, so new files are covered without editing this test.
"""

from __future__ import annotations

import importlib.util
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
    bad = sorted(m for m in sys.modules if any(m == f or m.startswith(f + ".") for f in forbidden))
    if bad:
        print(f"{{name}} imported {{', '.join(bad[:5])}}")
        sys.exit(1)
print("ok")
"""


def _package_of_folder() -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("package_tree", ROOT / "scripts" / "package_tree.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {folder: name for name, folder in module.package_dirs().items()}


def _modules(*patterns: str) -> list[str]:
    packages = _package_of_folder()
    names = []
    for pattern in patterns:
        for path in sorted(ROOT.glob(pattern)):
            parts = path.relative_to(ROOT).with_suffix("").parts
            parts = (packages[parts[0]], *parts[1:])
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return list(dict.fromkeys(names))


def _check(modules: list[str], forbidden: set[str]) -> subprocess.CompletedProcess:
    code = CHECK.format(modules=modules, forbidden=sorted(forbidden), optional=ENGINE_ONLY_PACKAGES)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


WEB_STACK = {"fastapi", "uvicorn", "starlette", "prometheus_client", "opentelemetry", "gatherwise.sidecar"}


@pytest.mark.timeout(150)
def test_the_core_imports_neither_torch_nor_the_web_stack():
    modules = [m for m in _modules("gatherwise/*.py", "gatherwise/**/*.py") if m != "gatherwise.__main__"]
    assert "gatherwise.shm_format.ring" in modules and "gatherwise.config" in modules and "gatherwise.cli" in modules
    result = _check(modules, {"torch", "gatherwise.engine_hooks", "gatherwise.tp_engine"} | WEB_STACK)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout + result.stderr


@pytest.mark.timeout(150)
def test_sidecar_never_imports_torch():
    modules = _modules("sidecar/*.py", "sidecar/**/*.py")
    assert "gatherwise.sidecar.ring_reader" in modules
    result = _check(modules, {"torch", "gatherwise.engine_hooks"})
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout + result.stderr


@pytest.mark.timeout(150)
def test_engine_hooks_never_import_the_sidecar_stack():
    modules = _modules("engine_hooks/*.py", "engine_hooks/**/*.py")
    assert "gatherwise.engine_hooks.recorder" in modules and "gatherwise.engine_hooks.cuda_timing" in modules
    result = _check(modules, WEB_STACK)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout + result.stderr


def test_the_checker_notices_a_violation():
    result = _check(["json"], {"json"})
    assert result.returncode == 1 and "json imported json" in result.stdout


@pytest.mark.timeout(150)
def test_the_gpu_check_needs_only_torch_pyyaml_and_prometheus_client():
    """scripts/gpu_check.sh runs on GPU machines that have torch, pyyaml and prometheus-client and nothing else
    (no network, nothing installed): nothing it imports may need another third-party package."""
    hooks = ["table_source", "comm", "graphs", "sampling", "cuda_timing", "logits_path", "recorder"]
    modules = ["gatherwise.bench.gpu_check", *(f"gatherwise.engine_hooks.{name}" for name in hooks),
               "gatherwise.sidecar.ring_reader", "gatherwise.sidecar.metrics",
               "gatherwise.sidecar.header_counters"]
    result = _check(modules, {"pydantic", "fastapi", "starlette", "uvicorn", "opentelemetry", "httpx", "jinja2",
                              "tokenizers", "safetensors", "transformers"})
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout + result.stderr
