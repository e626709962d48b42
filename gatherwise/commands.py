"""The `gatherwise` subcommands, found by entry point: each floor declares its own in pyproject.toml
(`[project.entry-points."gatherwise.commands"]`), so the torch-free core names no floor above it. They are read
from the distribution's metadata, as any entry point is.

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


def commands() -> dict[str, Command]:
    """Every subcommand by name, sorted, from the distribution's metadata (an install's dist-info, or the one
    scripts/package_tree.py writes for a plain checkout)."""
    found = [_parse(ep.name, ep.value) for ep in entry_points(group=GROUP)]
    return {command.name: command for command in sorted(found, key=lambda command: command.name)}
