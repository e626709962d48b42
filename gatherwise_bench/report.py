"""Per-rank call times -> per-shape statistics, winners, crossovers; the nccl-tests style table; results.json.

Formulas (docs/bench.md):
- time of a call = max over ranks of its end - min over ranks of its start (a barrier precedes each call);
- bytes = P * rows * width * element size: the logits the collective moves into one place (padding included),
  the same for every mode so bandwidths compare; what each mode really moved is `wire_bytes`;
- algbw = bytes / median time; busbw = algbw * (P - 1) / P for both modes (all_gather: nccl-tests
  convention; gather + broadcast: the root receives the same (P - 1) / P of the bytes over its link, and the
  token broadcast, (rows + 1) * 8 bytes, is left out as negligible).
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gatherwise.bench.sweep import CallTimes, ShapeKey, SweepConfig
from gatherwise.engine_hooks.logits_path import shard_width
from gatherwise.engine_hooks.torch_dtypes import TORCH_LOGITS_DTYPES

# A winner counts for crossovers only when it won this share of the interleaved pairs: 0.75 is ~2.7 sigma
# away from a coin flip at 30 pairs, so scheduler noise on a shared machine does not draw crossovers.
CLEAR_WIN_SHARE = 0.75


@dataclass(frozen=True)
class ModeStats:
    median_us: float
    p10_us: float
    p90_us: float
    algbw_gbs: float
    busbw_gbs: float
    # rank 0's medians of the phases inside run() (what the path's recorder saw)
    collective_us: float
    sample_us: float
    broadcast_us: float  # the second operation: token broadcast (gather) or shard_resolve (sharded)
    wire_bytes: int = 0  # rank 0's median bytes over all collectives of a call, as the path recorded them
    fallback_share: float | None = None  # sharded top-p: share of rows that took the full-row fallback


@dataclass(frozen=True)
class ShapeResult:
    vocab: int
    dtype: str
    rows: int
    bytes: int
    modes: dict[str, ModeStats]
    winner: str
    ratio: float | None  # runner-up median / winner median; None with a single mode
    # share of iterations in which the winner's call beat the runner-up's call of the same iteration (the
    # modes are interleaved, so each pair saw the same machine state); near 0.5 means "too close to call"
    paired_win_share: float | None
    sampling: str = "greedy"

    @property
    def clear(self) -> bool:
        """The winner beat the runner-up in at least CLEAR_WIN_SHARE of the pairs (or ran alone)."""
        return self.paired_win_share is None or self.paired_win_share >= CLEAR_WIN_SHARE


@dataclass(frozen=True)
class Crossover:
    vocab: int
    dtype: str
    rows_below: int  # last measured rows where `before` wins
    rows_above: int  # first measured rows where `after` wins
    rows_estimate: float  # where the two medians cross, interpolated log-log
    before: str
    after: str
    wins_below: float  # paired win share of `before` at rows_below, of `after` at rows_above (see ShapeResult)
    wins_above: float
    sampling: str = "greedy"


@dataclass
class SweepResult:
    config: SweepConfig
    shapes: list[ShapeResult]
    crossovers: list[Crossover] = field(default_factory=list)
    env: dict[str, Any] = field(default_factory=dict)


def _us(ns: np.ndarray | float) -> float:
    return float(ns) / 1e3


def summarize(cfg: SweepConfig, per_rank: list[dict[ShapeKey, CallTimes]]) -> list[ShapeResult]:
    shapes = []
    for vocab in cfg.vocabs:
        width = shard_width(vocab, cfg.tp)
        for dtype in cfg.dtypes:
            elem = TORCH_LOGITS_DTYPES[dtype].itemsize
            for sampling in cfg.samplings:
                for rows in cfg.rows:
                    nbytes = cfg.tp * rows * width * elem
                    key = (vocab, dtype, sampling, rows)
                    keys = {m: (*key, m) for m in cfg.modes}
                    spans = {m: call_spans([r[keys[m]] for r in per_rank]) for m in cfg.modes}
                    stats = {m: _mode_stats(cfg.tp, nbytes, spans[m], per_rank[0][keys[m]]) for m in cfg.modes}
                    ranked = sorted(stats, key=lambda m: stats[m].median_us)
                    ratio = share = None
                    if len(ranked) > 1:
                        ratio = stats[ranked[1]].median_us / stats[ranked[0]].median_us
                        share = float(np.mean(spans[ranked[0]] < spans[ranked[1]]))
                    shapes.append(ShapeResult(vocab, dtype, rows, nbytes, stats, ranked[0], ratio, share, sampling))
    return shapes


def call_spans(ranks: list[CallTimes]) -> np.ndarray:
    """Per call: max over ranks of its end - min over ranks of its start (ns)."""
    starts = np.array([r.start for r in ranks], dtype=np.int64)
    ends = np.array([r.end for r in ranks], dtype=np.int64)
    return ends.max(axis=0) - starts.min(axis=0)


def _mode_stats(tp: int, nbytes: int, span: np.ndarray, root: CallTimes) -> ModeStats:
    p10, median, p90 = np.percentile(span, [10, 50, 90])
    algbw = nbytes / (median * 1e-9) / 1e9 if median > 0 else 0.0
    return ModeStats(
        median_us=_us(median), p10_us=_us(p10), p90_us=_us(p90),
        algbw_gbs=algbw, busbw_gbs=algbw * (tp - 1) / tp,
        collective_us=_us(np.median(root.collective)), sample_us=_us(np.median(root.sample)),
        broadcast_us=_us(np.median(root.broadcast)), wire_bytes=int(np.median(root.wire_bytes)),
        fallback_share=root.fallback_rows / root.topp_rows if root.topp_rows else None,
    )


def find_crossovers(shapes: list[ShapeResult]) -> list[Crossover]:
    """Where the winner changes between adjacent rows with a clear winner (ties skipped), per (vocab, dtype)."""
    out = []
    groups: dict[tuple[int, str, str], list[ShapeResult]] = {}
    for s in shapes:
        if s.clear:
            groups.setdefault((s.vocab, s.dtype, s.sampling), []).append(s)
    for (vocab, dtype, sampling), group in groups.items():
        group.sort(key=lambda s: s.rows)
        for lo, hi in itertools.pairwise(group):
            if lo.winner == hi.winner:
                continue
            a, b = lo.winner, hi.winner  # d = log(t_a / t_b): < 0 at lo, > 0 at hi (or equal)
            d_lo = math.log(lo.modes[a].median_us / lo.modes[b].median_us)
            d_hi = math.log(hi.modes[a].median_us / hi.modes[b].median_us)
            frac = d_lo / (d_lo - d_hi) if d_lo != d_hi else 0.5
            x = math.log(lo.rows) + frac * (math.log(hi.rows) - math.log(lo.rows))
            out.append(Crossover(vocab, dtype, lo.rows, hi.rows, math.exp(x), a, b, lo.paired_win_share or 0.0,
                                 hi.paired_win_share or 0.0, sampling))
    return out


def verdicts(shapes: list[ShapeResult]) -> dict[str, str]:
    """Per "vocab/dtype[/sampling]": the clear winner per rows, e.g. "1:tie 2:tie 4:all_gather 8:gather ..."."""
    out: dict[str, list[str]] = {}
    for s in sorted(shapes, key=lambda s: (s.vocab, s.dtype, s.sampling, s.rows)):
        out.setdefault(shape_group(s.vocab, s.dtype, s.sampling), []).append(
            f"{s.rows}:{s.winner if s.clear else 'tie'}")
    return {k: " ".join(v) for k, v in out.items()}


def shape_group(vocab: int, dtype: str, sampling: str) -> str:
    """The key of a (vocab, dtype, sampling) group: "vocab/dtype" for greedy, else "vocab/dtype/sampling"."""
    return f"{vocab}/{dtype}" if sampling == "greedy" else f"{vocab}/{dtype}/{sampling}"


def format_table(result: SweepResult) -> str:
    cfg = result.config
    modes = cfg.modes
    head1 = f"{'':>50}" + "".join(f"  {m:^42}" for m in modes)
    head2 = f"{'vocab':>8} {'dtype':>9} {'sampling':>13} {'rows':>6} {'bytes':>10}" + "".join(
        f"  {'median':>8} {'p10':>8} {'p90':>8} {'algbw':>7} {'busbw':>7}" for _ in modes)
    head2 += f"  {'winner':>10} {'ratio':>6} {'wins':>5}"
    units = f"{'':>8} {'':>9} {'':>13} {'':>6} {'(B)':>10}" + "".join(
        f"  {'(us)':>8} {'(us)':>8} {'(us)':>8} {'(GB/s)':>7} {'(GB/s)':>7}" for _ in modes)
    lines = [
        f"# gatherwise bench: tp={cfg.tp} backend={cfg.backend} device={cfg.device} iters={cfg.iters} "
        f"warmup={cfg.warmup}",
        "# time per call = max over ranks of end - min over ranks of start (barrier before each call);"
        " busbw = algbw*(P-1)/P",
        "# ratio = runner-up median / winner median; wins = share of interleaved pairs the winner was faster in",
    ]
    if "nodes" in result.env:
        lines.append(f"# {measured_ranks_note(result.env['nodes'])}")
    lines += ["#" + head1[1:], "#" + head2[1:], "#" + units[1:]]
    for s in result.shapes:
        line = f"{s.vocab:>8} {s.dtype:>9} {s.sampling:>13} {s.rows:>6} {s.bytes:>10}"
        for m in modes:
            st = s.modes[m]
            line += (f"  {st.median_us:>8.1f} {st.p10_us:>8.1f} {st.p90_us:>8.1f}"
                     f" {st.algbw_gbs:>7.2f} {st.busbw_gbs:>7.2f}")
        if s.ratio is not None:
            line += f"  {s.winner:>10} {s.ratio:>6.2f} {s.paired_win_share:>5.0%}" + ("" if s.clear else " tie")
        else:
            line += f"  {s.winner:>10} {'-':>6} {'-':>5}"
        lines.append(line)
    lines.append(f"# crossovers (winner changes between adjacent rows with wins >= {CLEAR_WIN_SHARE:.0%}; "
                 "rows with fewer wins are ties and skipped):")
    for c in result.crossovers or []:
        lines.append(f"#   vocab={c.vocab} {c.dtype} {c.sampling}: {c.before} -> {c.after} between rows "
                     f"{c.rows_below} and {c.rows_above} (medians cross near {c.rows_estimate:.1f}; "
                     f"wins {c.wins_below:.0%} / {c.wins_above:.0%})")
    if not result.crossovers:
        lines.append("#   none")
    lines.append("# clear winner per rows:")
    lines += [f"#   {key}: {line}" for key, line in verdicts(result.shapes).items()]
    fallbacks = [s for s in result.shapes if any(st.fallback_share for st in s.modes.values())]
    if fallbacks:
        lines.append("# sharded top-p rows that took the full-row fallback (nucleus beyond the candidates):")
        lines += [f"#   {shape_group(s.vocab, s.dtype, s.sampling)} rows={s.rows}: "
                  f"{s.modes['sharded'].fallback_share:.0%}" for s in fallbacks if "sharded" in s.modes]
    return "\n".join(line.rstrip() for line in lines)


def measured_ranks_note(nodes: dict[str, Any]) -> str:
    """Across nodes the spans cover node 0's ranks only: another node's clock is unrelated to node 0's."""
    ranks = nodes["measured_ranks"]
    where = ", ".join(f"node {k}: ranks {v[0]}..{v[-1]}" for k, v in nodes["ranks_by_node"].items())
    return (f"{nodes['count']} nodes ({where}); times are spans over ranks {ranks[0]}..{ranks[-1]} on node "
            f"{nodes['measured_on_node']} only (one clock); a call's wait for the other nodes' shards is inside them, "
            "their ranks' own ends are not")


def write_results_json(path: Path, result: SweepResult, tables: dict[str, str]) -> Path:
    doc = {
        "config": asdict(result.config),
        "env": result.env,
        "timing": "per call: max over ranks of end minus min over ranks of start; barrier before each call; "
                  "time.perf_counter_ns (CLOCK_MONOTONIC)" +
                  (f"; {measured_ranks_note(result.env['nodes'])}" if "nodes" in result.env else ""),
        "formulas": {"bytes": "P * rows * shard_width * element_size",
                     "wire_bytes": "rank 0's median bytes over all collectives of a call (as recorded)",
                     "algbw_gbs": "bytes / median_time / 1e9", "busbw_gbs": "algbw * (P - 1) / P"},
        "clear_win_share": CLEAR_WIN_SHARE,
        "results": [{**asdict(s), "clear": s.clear} for s in result.shapes],
        "crossovers": [asdict(c) for c in result.crossovers],
        "verdicts": verdicts(result.shapes),
        "table_files": tables,
    }
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def load_results(path: Path) -> SweepResult:
    """A SweepResult back from results.json (to re-render the table, plot and table files without re-running)."""
    doc = json.loads(Path(path).read_text())
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in doc["config"].items()}
    cfg = SweepConfig(**fields)
    shapes = [ShapeResult(s["vocab"], s["dtype"], s["rows"], s["bytes"],
                          {m: ModeStats(**st) for m, st in s["modes"].items()}, s["winner"], s["ratio"],
                          s["paired_win_share"], s.get("sampling", "greedy")) for s in doc["results"]]
    return SweepResult(cfg, shapes, find_crossovers(shapes), doc["env"])
