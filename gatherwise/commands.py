"""The `gatherwise` subcommands, found by entry point: each floor declares its own in pyproject.toml
(`[project.entry-points."gatherwise.commands"]`), so the torch-free core names no floor above it.

A command's help line is the first line of its module's docstring, read from the source file without running the
module: `gatherwise --help` then imports neither torch nor the web stack, and works without any extra installed.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

GROUP = "gatherwise.commands"
# Run from a checkout that was never installed (e.g. the GPU machine's package tree): no dist-info to read the
# entry points from, so they come from the pyproject.toml next to the package's folder instead.
_CHECKOUT_PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


@dataclass(frozen=True)
class Command:
    name: str
    module: str
    function: str

    def load(self) -> Callable[[list[str]], int | None]:
        return getattr(importlib.import_module(self.module), self.function)

    def help_line(self) -> str:
        spec = importlib.util.find_spec(self.module)
        if spec is None or spec.origin is None:
            return ""
        docstring = ast.get_docstring(ast.parse(Path(spec.origin).read_text(encoding="utf-8"))) or ""
        first = " ".join(docstring.strip().split("\n\n", 1)[0].split())  # the first paragraph, on one line
        # "`gatherwise demo`: engine + sidecar ..." says the command's name twice; keep what follows the colon
        named = re.match(r"(?:`gatherwise [^`]*`[\s/]*)+:\s*(.+)", first)
        return named.group(1) if named else first.replace("`", "")


def _parse(name: str, value: str) -> Command:
    module, _, function = value.strip().partition(":")
    return Command(name.strip(), module.strip(), function.strip())


def _from_checkout() -> list[Command]:
    if not _CHECKOUT_PYPROJECT.is_file():
        return []
    text = _CHECKOUT_PYPROJECT.read_text(encoding="utf-8")
    header = f'[project.entry-points."{GROUP}"]'
    if header not in text:
        return []
    section = text.split(header, 1)[1].split("\n[", 1)[0]
    return [_parse(name, value) for name, value in re.findall(r'^(\w+)\s*=\s*"([^"]+)"', section, flags=re.M)]


def commands() -> dict[str, Command]:
    """Every subcommand by name, sorted (installed metadata and a checkout list them alike)."""
    found = [_parse(ep.name, ep.value) for ep in entry_points(group=GROUP)] or _from_checkout()
    return {command.name: command for command in sorted(found, key=lambda command: command.name)}
