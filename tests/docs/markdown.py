"""Reading the facts a doc states in its markdown tables and code spans, for the drift tests beside this module.

A doc states a checkable fact in a table under a heading; these helpers find the table by that heading (so prose
around it may change freely) and give its rows as dicts keyed by the header's cells.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


@dataclass(frozen=True)
class Table:
    heading: str  # the nearest heading above the table, without its #s
    header: tuple[str, ...]
    rows: tuple[dict[str, str], ...]


def _cells(line: str) -> list[str]:
    # a `|` inside a code span (e.g. `a | b`) is no cell boundary
    parts, depth, cell = [], False, ""
    for ch in line.strip().strip("|"):
        if ch == "`":
            depth = not depth
        if ch == "|" and not depth:
            parts.append(cell.strip())
            cell = ""
        else:
            cell += ch
    parts.append(cell.strip())
    return parts


def tables(text: str) -> list[Table]:
    """Every table of `text`, in order, with the heading it sits under."""
    found: list[Table] = []
    heading = ""
    lines = [line.strip() for line in text.splitlines()]  # a table may sit indented inside a list item
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        elif line.startswith("|") and i + 1 < len(lines) and re.fullmatch(r"\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?",
                                                                        lines[i + 1].strip()):
            header = tuple(_cells(line))
            i += 2
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(dict(zip(header, _cells(lines[i]), strict=False)))
                i += 1
            found.append(Table(heading, header, tuple(rows)))
            continue
        i += 1
    return found


def table(text: str, heading: str, *columns: str) -> Table:
    """The one table under a heading that starts with `heading` whose first columns are `columns`."""
    matches = [t for t in tables(text) if t.heading.startswith(heading) and t.header[:len(columns)] == columns]
    if len(matches) != 1:
        raise AssertionError(f"expected one table with columns {columns} under {heading!r}, found {len(matches)}")
    return matches[0]


def code_spans(cell: str) -> list[str]:
    """The `code` spans of a cell, in order."""
    return re.findall(r"`([^`]+)`", cell)


def read(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")
