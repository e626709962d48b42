"""The measured winners as a starting table for the auto policy (one file per vocab and dtype).

Per bucket with measured rows, the mode with the smallest summed median over those rows wins; buckets
beyond (or between) the measured rows take the nearest measured bucket (engine_hooks.table_file).
"""

from __future__ import annotations

from pathlib import Path

from bench.report import ShapeResult
from bench.sweep import SweepConfig
from engine_hooks.modes import Mode, ModeTable, bucket_of
from engine_hooks.table_file import fill_nearest, save_table_file


def best_table(shapes: list[ShapeResult]) -> ModeTable:
    """Mode per bucket from the shapes of one (vocab, dtype)."""
    cost: dict[int, dict[str, float]] = {}
    for s in shapes:
        per_mode = cost.setdefault(bucket_of(s.rows), {})
        for mode, st in s.modes.items():
            per_mode[mode] = per_mode.get(mode, 0.0) + st.median_us
    known = {b: Mode.parse(min(per_mode, key=per_mode.__getitem__)) for b, per_mode in cost.items()}
    return fill_nearest(known)


def table_file_name(tp: int, vocab: int, dtype: str) -> str:
    return f"table_tp{tp}_v{vocab}_{dtype}.yaml"


def write_starting_tables(out_dir: Path, cfg: SweepConfig, shapes: list[ShapeResult]) -> dict[str, str]:
    """Write one table file per (vocab, dtype); returns {"<vocab>/<dtype>": file name}."""
    written = {}
    for vocab in cfg.vocabs:
        for dtype in cfg.dtypes:
            group = [s for s in shapes if s.vocab == vocab and s.dtype == dtype]
            name = table_file_name(cfg.tp, vocab, dtype)
            meta = {"tp": cfg.tp, "vocab": vocab, "dtype": dtype, "source": "gatherwise bench",
                    "backend": cfg.backend, "device": cfg.device, "measured_rows": sorted(s.rows for s in group)}
            save_table_file(out_dir / name, best_table(group), meta)
            written[f"{vocab}/{dtype}"] = name
    return written
