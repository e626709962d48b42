"""Import rules: the core (`gatherwise`) pulls in neither torch nor the web stack; the sidecar never pulls in torch
or the engine hooks; the engine hooks never pull in the sidecar's web/telemetry stack. And over the whole source
tree, read with `ast` (every import, including those inside functions): no floor names a floor above it, no room of
the sidecar (its subpackages) names a room above it, and no modules import each other in a circle; the checkout's
lab sits above every floor, so nothing installed names it.

The import checks run in a fresh interpreter, import the modules one by one, and name the first one that broke the
rule. Modules are globbed at test time, so new files are covered without editing this test.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tests._repo import ROOT

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


def _package_dirs() -> dict[str, str]:
    """Installed package name -> its folder in the repository (pyproject.toml, read by scripts/package_tree.py)."""
    spec = importlib.util.spec_from_file_location("package_tree", ROOT / "scripts" / "package_tree.py")
    assert spec is not None and spec.loader is not None, "scripts/package_tree.py cannot be loaded"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.package_dirs()


def _package_of_folder() -> dict[str, str]:
    return {folder: name for name, folder in _package_dirs().items()}


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
    """`modules` imported one by one in a fresh interpreter, run from the checkout's root (`tests` imports too)."""
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
    assert "gatherwise.sidecar.ingest.ring_reader" in modules
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
    (no network, nothing installed, no pytest): nothing it imports may need another third-party package. Its checks
    live in tests/, so this holds them, and the harness they run in, to stay clear of pytest too."""
    hooks = ["table_source", "comm", "graphs", "sampling", "cuda_timing", "logits_path", "recorder"]
    modules = ["tests.machine.gpu_checks", *(f"gatherwise.engine_hooks.{name}" for name in hooks),
               "gatherwise.sidecar.ingest.ring_reader", "gatherwise.sidecar.metrics.exposition",
               "gatherwise.sidecar.metrics.header_counters"]
    result = _check(modules, {"pydantic", "fastapi", "starlette", "uvicorn", "opentelemetry", "httpx", "jinja2",
                              "tokenizers", "safetensors", "transformers", "pytest", "_pytest"})
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout + result.stderr


# -- floors and circles, from the source ---------------------------------------------------------------------------
# The floors, lowest first: a module may import its own floor and the floors below it, never one above.
FLOORS = (
    ("gatherwise", "the torch-free core both sides must agree on (modes, shared-memory formats, config)"),
    ("gatherwise.engine_hooks", "the logits path inside every TP rank, built on the core alone"),
    ("gatherwise.tp_engine", "the reference engine, which runs the hooks it exists to exercise"),
    ("gatherwise.sidecar", "the observer: reads what the engine writes, exports it, switches the mode"),
    ("gatherwise.dashboards", "dashboards, the local stack and the demo, which start engine and sidecar as processes"),
    ("gatherwise.bench", "benchmarks, which drive every floor below"),
    ("lab", "measurements and stand-ins run from a checkout, never installed: no installed module names them"),
)
# Packages of the checkout that are floors but no part of the installed package: name -> folder.
CHECKOUT_PACKAGES = {"lab": "lab"}
# The sidecar's rooms, lowest first: a module may import its own room and the rooms below it, never one above.
SIDECAR_ROOMS = (
    ("gatherwise.sidecar.traces", "the OpenTelemetry tracer: one trace per sampled call, decision events"),
    ("gatherwise.sidecar.metrics", "Prometheus: family names, lean histograms, scrape-time collectors, exposition"),
    ("gatherwise.sidecar.ingest", "rings -> joined calls: discovery, ring reading, the attached engine, hooks-off"),
    ("gatherwise.sidecar.policy", "the mode policy (pure decisions), its estimates, evidence, call costs, saved state"),
    ("gatherwise.sidecar.control", "the loop thread and its schedule, control block, sessions, the control API"),
    ("gatherwise.sidecar.state", "the composition root: every part built once and wired"),
    ("gatherwise.sidecar.api", "HTTP: the app, routes, bodies, limits, and the `sidecar` and `mode` commands"),
)


def _source_modules() -> dict[str, Path]:
    modules = {}
    for package, folder in (_package_dirs() | CHECKOUT_PACKAGES).items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            modules[".".join((package, *parts))] = path
    return modules


def _imported_names(module: str, path: Path) -> Iterator[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)  # `from pkg import submodule`


def import_graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """module -> the source modules it imports (a name resolves to its longest prefix that is a module here)."""
    graph = {}
    for module, path in modules.items():
        targets = set()
        for imported in _imported_names(module, path):
            name = imported
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def floor_of(module: str) -> int:
    matches = [i for i, (floor, _) in enumerate(FLOORS) if module == floor or module.startswith(floor + ".")]
    return max(matches, key=lambda i: len(FLOORS[i][0]))


def upward_imports(graph: Mapping[str, set[str]]) -> list[str]:
    return sorted(f"{a} ({FLOORS[floor_of(a)][0]}) imports {b} ({FLOORS[floor_of(b)][0]})"
                  for a, targets in graph.items() for b in targets if floor_of(b) > floor_of(a))


def circles(graph: Mapping[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))
    return found


def test_the_floors_cover_every_source_folder():
    assert {package for package, _ in FLOORS} == set(_package_dirs()) | set(CHECKOUT_PACKAGES)


def test_no_floor_imports_a_floor_above_it():
    graph = import_graph(_source_modules())
    assert "gatherwise.dashboards.local_stack" in graph and "gatherwise.cli" in graph and "lab.auto_policy" in graph
    assert upward_imports(graph) == []


def test_no_modules_import_each_other_in_a_circle():
    found = circles(import_graph(_source_modules()))
    assert not found, "import circles: " + "; ".join(" <-> ".join(sorted(c)) for c in found)


def room_of(module: str) -> int | None:
    """The sidecar room a module is in (None outside the sidecar's rooms: other floors, the package itself)."""
    for i, (room, _) in enumerate(SIDECAR_ROOMS):
        if module == room or module.startswith(room + "."):
            return i
    return None


def rooms_upward(graph: Mapping[str, set[str]]) -> list[str]:
    found = []
    for a, targets in graph.items():
        here = room_of(a)
        for b in targets:
            there = room_of(b)
            if here is not None and there is not None and there > here:
                found.append(f"{a} ({SIDECAR_ROOMS[here][0]}) imports {b} ({SIDECAR_ROOMS[there][0]})")
    return sorted(found)


def test_every_sidecar_module_is_in_a_room():
    modules = [m for m in _source_modules() if m.startswith("gatherwise.sidecar.")]
    assert "gatherwise.sidecar.ingest.ring_reader" in modules
    assert [m for m in modules if room_of(m) is None] == []


def test_no_sidecar_room_imports_a_room_above_it():
    graph = import_graph(_source_modules())
    assert "gatherwise.sidecar.api.app" in graph and "gatherwise.sidecar.policy.mode_policy" in graph
    assert rooms_upward(graph) == []


def test_the_room_check_notices_an_upward_import():
    graph = {"gatherwise.sidecar.control.control_api": {"gatherwise.sidecar.api.control_models"},
             "gatherwise.sidecar.api.control_models": {"gatherwise.sidecar.policy.mode_policy"},
             "gatherwise.sidecar.policy.mode_policy": set()}
    assert rooms_upward(graph) == ["gatherwise.sidecar.control.control_api (gatherwise.sidecar.control) imports "
                                   "gatherwise.sidecar.api.control_models (gatherwise.sidecar.api)"]


def test_the_core_names_no_upper_floor_even_in_a_string():
    """The core's command line finds the floors' commands by entry point; no module path of an upper floor is
    spelled out in the core's code (a string to import would hide the dependency from the checks above).
    Docstrings may name them."""
    upper = tuple(floor + "." for floor, _ in FLOORS[1:]) + tuple(f"{floor}:" for floor, _ in FLOORS[1:])
    named = []
    for module, path in _source_modules().items():
        if floor_of(module) != 0:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
        named += [f"{module}: {node.value!r}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                  and any(floor in node.value for floor in upper)]
    assert named == []


def test_the_graph_checks_notice_circles_and_upward_imports():
    graph = {"gatherwise.modes": {"gatherwise.sidecar.api.app"}, "gatherwise.sidecar.api.app": {"gatherwise.modes"},
             "gatherwise.sidecar.metrics.exposition": set()}
    assert circles(graph) == {frozenset({"gatherwise.modes", "gatherwise.sidecar.api.app"})}
    assert upward_imports(graph) == [
        "gatherwise.modes (gatherwise) imports gatherwise.sidecar.api.app (gatherwise.sidecar)"]
