"""Real copies of an engine's sources for the fingerprint tests: the modules of the given points (from an installed
tree or a wheel) written as an installed tree with its distribution's metadata, and one function in it altered."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from gatherwise.engine_hooks.fingerprints.fingerprint import find_definition
from gatherwise.engine_hooks.fingerprints.point import Point
from gatherwise.engine_hooks.fingerprints.source_tree import SourceTree, module_files
from tests._repo import ROOT


def run_doctor(env: dict[str, str]) -> subprocess.CompletedProcess:
    """`gatherwise doctor` in this interpreter's environment with `env`."""
    return subprocess.run([sys.executable, "-m", "gatherwise", "doctor"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=env)


def copy_sources(tree: SourceTree, package: str, points: Iterable[Point], dest: Path) -> Path:
    """`dest` as a site directory holding `package`'s modules of `points` (the present ones) and a dist-info with
    the version `tree` has."""
    for module in sorted({p.module for p in points} | {package}):
        text = tree.source(module)
        if text is None:
            continue
        plain, init = module_files(module)
        path = dest / (init if tree.source(module + ".__init__") is not None else plain)  # a package's own file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    dist = dest / f"{package}-{tree.version(package)}.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: {tree.version(package)}\n")
    (dist / "top_level.txt").write_text(f"{package}\n")
    return dest


def alter(site: Path, point: Point) -> None:
    """Add one statement at the top of the point's function body in the copy under `site`."""
    path = next(p for p in (site / f for f in module_files(point.module)) if p.is_file())
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    node = find_definition(ast.parse("".join(lines)), point.qualname)
    assert isinstance(node, ast.FunctionDef), f"{point.name} is no function in {path}"
    first = node.body[0]
    lines.insert(first.lineno - 1, " " * first.col_offset + "pass\n")
    path.write_text("".join(lines), encoding="utf-8")
