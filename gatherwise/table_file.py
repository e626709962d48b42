"""Starting-table files: a mode per batch-size bucket, like an NCCL tuner table.

`gatherwise bench` writes them; the auto policy loads one as its starting table. Stdlib + yaml only, no
torch: the sidecar's policy imports this module.

Format (YAML; JSON is valid YAML too):

    tp: 2
    vocab: 32000
    dtype: float32
    table: {"1": gather, "2": gather, "4": all_gather, ...}   # bucket upper bound -> mode

Buckets missing from `table` take the mode of the nearest listed bucket (the lower one on a tie), the same
rule the bench uses for buckets beyond the rows it measured. Any other key is kept as metadata.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gatherwise.modes import NUM_BUCKETS, Mode, ModeTable, bucket_from_upper_bound

_INT_META = ("tp", "vocab")


@dataclass(frozen=True)
class TableFile:
    table: ModeTable
    meta: dict[str, Any] = field(default_factory=dict)


def fill_nearest(known: dict[int, Mode]) -> ModeTable:
    """A full table from some buckets: each missing bucket takes the nearest known one (lower on a tie)."""
    if not known:
        raise ValueError("no buckets to build a table from")
    modes = []
    for b in range(NUM_BUCKETS):
        nearest = min(known, key=lambda k: (abs(k - b), k))
        modes.append(known[nearest])
    return ModeTable(tuple(modes))


def save_table_file(path: str | Path, table: ModeTable, meta: dict[str, Any] | None = None) -> Path:
    """Write `table` (all buckets) with `meta` (tp, vocab, dtype, provenance...) as YAML."""
    meta = dict(meta or {})
    if "table" in meta:
        raise ValueError("meta must not contain the key 'table'")
    path = Path(path)
    doc = {**meta, "table": table.as_labels()}
    path.write_text(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
    return path


def read_table_file(path: str | Path) -> TableFile:
    """Parse and validate a table file; every error is a ValueError that names the file and the key."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a mapping with a 'table' key, got {type(doc).__name__}")
    labels = doc.get("table")
    if not isinstance(labels, dict) or not labels:
        raise ValueError(f"{path}: key 'table' must be a non-empty mapping of bucket -> mode")
    known: dict[int, Mode] = {}
    for key, value in labels.items():
        try:
            bucket = bucket_from_upper_bound(_as_int(key))
        except ValueError as exc:
            raise ValueError(f"{path}: table key {key!r}: {exc}") from None
        if not isinstance(value, str):
            raise ValueError(f"{path}: table[{key!r}]: mode must be a string, got {value!r}")
        try:
            known[bucket] = Mode.parse(value)
        except ValueError as exc:
            raise ValueError(f"{path}: table[{key!r}]: {exc}") from None
    meta = {k: v for k, v in doc.items() if k != "table"}
    for key in _INT_META:
        if key in meta and (not isinstance(meta[key], int) or isinstance(meta[key], bool) or meta[key] < 1):
            raise ValueError(f"{path}: key {key!r} must be an integer >= 1, got {meta[key]!r}")
    return TableFile(fill_nearest(known), meta)


def load_table_file(path: str | Path) -> ModeTable:
    """The starting table stored in `path` (see read_table_file for validation)."""
    return read_table_file(path).table


def _as_int(key: Any) -> int:
    # YAML turns an unquoted 1 into an int and "1" into a str; accept both, nothing else
    if isinstance(key, bool):
        raise ValueError(f"bucket must be a power of two, got {key!r}")
    if isinstance(key, int):
        return key
    if isinstance(key, str) and key.strip().isdigit():
        return int(key)
    raise ValueError(f"bucket must be a power of two, got {key!r}")
