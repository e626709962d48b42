"""The measured winners as a starting table for the auto policy (one file per vocab, dtype and sampling).

A bucket is decided when every measured rows value in it has the same clear winner (gatherwise.bench.report: the
winner won >= CLEAR_WIN_SHARE of the interleaved pairs). Every other bucket — ties, and buckets beyond or
between the measured rows — takes the mode of the nearest decided bucket (gatherwise.table_file), so noise
between two equal modes does not make the table flip back and forth. With no decided bucket at all, each
measured bucket takes the mode with the smallest summed median.
"""

from __future__ import annotations

from pathlib import Path

from gatherwise.bench.report import ShapeResult, shape_group
from gatherwise.bench.sweep import SweepConfig
from gatherwise.modes import Mode, ModeTable, bucket_of
from gatherwise.table_file import fill_nearest, save_table_file


def best_table(shapes: list[ShapeResult]) -> ModeTable:
    """Mode per bucket from the shapes of one (vocab, dtype)."""
    winners: dict[int, set[str]] = {}
    cost: dict[int, dict[str, float]] = {}
    for s in shapes:
        bucket = bucket_of(s.rows)
        winners.setdefault(bucket, set()).add(s.winner if s.clear else "tie")
        per_mode = cost.setdefault(bucket, {})
        for mode, st in s.modes.items():
            per_mode[mode] = per_mode.get(mode, 0.0) + st.median_us
    decided = {b: Mode.parse(next(iter(w))) for b, w in winners.items() if len(w) == 1 and "tie" not in w}
    if not decided:
        decided = {b: Mode.parse(min(per_mode, key=per_mode.__getitem__)) for b, per_mode in cost.items()}
    return fill_nearest(decided)


def table_file_name(tp: int, vocab: int, dtype: str, sampling: str = "greedy") -> str:
    suffix = "" if sampling == "greedy" else "_" + sampling.replace("=", "")
    return f"table_tp{tp}_v{vocab}_{dtype}{suffix}.yaml"


def write_starting_tables(out_dir: Path, cfg: SweepConfig, shapes: list[ShapeResult]) -> dict[str, str]:
    """Write one table file per (vocab, dtype, sampling); returns {"<vocab>/<dtype>[/<sampling>]": file name}."""
    written = {}
    for vocab in cfg.vocabs:
        for dtype in cfg.dtypes:
            for sampling in cfg.samplings:
                group = [s for s in shapes if s.vocab == vocab and s.dtype == dtype and s.sampling == sampling]
                name = table_file_name(cfg.tp, vocab, dtype, sampling)
                meta = {"tp": cfg.tp, "vocab": vocab, "dtype": dtype, "sampling": sampling,
                        "source": "gatherwise bench", "backend": cfg.backend, "device": cfg.device,
                        "measured_rows": sorted(s.rows for s in group)}
                save_table_file(out_dir / name, best_table(group), meta)
                written[shape_group(vocab, dtype, sampling)] = name
    return written
