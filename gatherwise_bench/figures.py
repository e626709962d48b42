"""The benchmarks' PNG figures: matplotlib without a display (imported only when a benchmark draws), and one way
to write a figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

DPI = 110


def pyplot() -> Any:
    """matplotlib.pyplot on the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    pyplot().close(fig)
    return path
