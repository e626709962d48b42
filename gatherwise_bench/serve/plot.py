"""serve.png: output tokens/s and TPOT p99 vs concurrency, one line per configuration, one row per sampling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gatherwise.bench.figures import pyplot, save


def plot_serve(path: Path, rows: list[dict[str, Any]], configurations: list[str], title: str) -> Path:
    samplings = sorted({r["sampling"] for r in rows})
    plt = pyplot()
    fig, axes = plt.subplots(len(samplings), 2, figsize=(10.4, 3.8 * len(samplings)), squeeze=False)
    for i, sampling in enumerate(samplings):
        for j, (what, label) in enumerate((("output_throughput", "output tokens/s"), ("tpot_p99", "TPOT p99 (ms)"))):
            ax = axes[i][j]
            for name in configurations:
                group = sorted((r for r in rows if r["configuration"] == name and r["sampling"] == sampling),
                               key=lambda r: r["concurrency"])
                if not group:
                    continue
                xs = [r["concurrency"] for r in group]
                ys = [r[what] if what in r else r["latencies_ms"][what] for r in group]
                ax.plot(xs, ys, marker="o", markersize=4, label=name)
            concurrencies = sorted({r["concurrency"] for r in rows})
            if len(concurrencies) > 1:
                ax.set_xscale("log", base=2)
            ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
            ax.set_ylim(bottom=0)  # ratios read true: a 2 % gap must not look like a factor
            ax.set_xlabel("max concurrency")
            ax.set_ylabel(label)
            ax.set_title(f"{sampling}: {label}", fontsize=9)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return save(fig, path)
