"""crossover.png: time per call vs rows, one line per mode, log-log, one panel per (vocab, dtype)."""

from __future__ import annotations

from pathlib import Path

from matplotlib.ticker import NullLocator

from gatherwise.bench.figures import pyplot, save
from gatherwise.bench.report import CLEAR_WIN_SHARE, SweepResult


def plot_crossover(path: Path, result: SweepResult) -> Path:
    cfg = result.config
    panels = [(v, s) for v in cfg.vocabs for s in cfg.samplings]
    nrows, ncols = len(panels), len(cfg.dtypes)
    plt = pyplot()
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.8 * nrows), squeeze=False)
    for i, (vocab, sampling) in enumerate(panels):
        for j, dtype in enumerate(cfg.dtypes):
            ax = axes[i][j]
            group = sorted((s for s in result.shapes if s.vocab == vocab and s.dtype == dtype
                            and s.sampling == sampling), key=lambda s: s.rows)
            xs = [s.rows for s in group]
            for mode in cfg.modes:
                med = [s.modes[mode].median_us for s in group]
                lo = [s.modes[mode].p10_us for s in group]
                hi = [s.modes[mode].p90_us for s in group]
                (line,) = ax.plot(xs, med, marker="o", markersize=3, label=f"{mode} (median)")
                ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
            ties = [s.rows for s in group if not s.clear]
            if ties:  # rows where neither mode won clearly (see docs/bench.md, "wins")
                ax.plot(ties, [0.03] * len(ties), "x", color="grey", transform=ax.get_xaxis_transform(),
                        label=f"tie (wins < {CLEAR_WIN_SHARE:.0%})")
            crossings = [c for c in result.crossovers if c.vocab == vocab and c.dtype == dtype
                         and c.sampling == sampling]
            for k, c in enumerate(crossings):
                ax.axvline(c.rows_estimate, color="black", linestyle="--", linewidth=1)
                ax.annotate(f"{c.before}→{c.after}\n≈{c.rows_estimate:.1f} rows", (c.rows_estimate, 0.96 - 0.14 * k),
                            xycoords=("data", "axes fraction"), ha="center", va="top", fontsize=7,
                            bbox={"boxstyle": "round", "fc": "white", "alpha": 0.8})
            if len(xs) > 1:
                ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [str(x) for x in xs])
            ax.xaxis.set_minor_locator(NullLocator())  # rows ticks only
            ax.set_yscale("log")
            ax.set_title(f"vocab {vocab}, {dtype}, {sampling}", fontsize=9)
            ax.set_xlabel("rows (batch)")
            ax.set_ylabel("time per call (µs)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"gatherwise bench: logits path, TP={cfg.tp}, {cfg.backend} on {cfg.device} "
                 f"(band: p10–p90, {cfg.iters} iters)", fontsize=10)
    return save(fig, path)
