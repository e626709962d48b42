"""Starting-table files: a mode per batch-size bucket, like an NCCL tuner table.

`gatherwise bench` writes them, the sidecar's GET /v1/policy/table answers one, and the auto policy (or an
engine's `initial_table_file`) loads one as its starting table. TableDocument is the format, defined once here;
pydantic + pyyaml only, no torch: the sidecar's policy imports this module.

Format (YAML; JSON is valid YAML too):

    tp: 2
    vocab: 32000
    dtype: float32
    table: {"1": gather, "2": gather, "4": all_gather, ...}   # bucket upper bound -> mode

Buckets missing from `table` take the mode of the nearest listed bucket (the lower one on a tie), the same
rule the bench uses for buckets beyond the rows it measured. Any other key is kept as metadata.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from gatherwise.bounded_yaml import read_yaml_file, short_message
from gatherwise.modes import NUM_BUCKETS, Mode, ModeTable, bucket_from_upper_bound, bucket_label
from gatherwise.validation_errors import error_text, joined_errors


def _bucket_modes(labels: Any) -> dict[str, str]:
    """{bucket upper bound: mode} as written (YAML makes an unquoted 1 an int) -> {"1": "gather", ...}."""
    if not isinstance(labels, dict) or not labels:
        raise ValueError("key 'table' must be a non-empty mapping of bucket -> mode")
    modes = {}
    for key, value in labels.items():
        try:
            bucket = bucket_label(bucket_from_upper_bound(_as_int(key)))
        except ValueError as exc:
            raise ValueError(f"table key {key!r}: {exc}") from None
        if not isinstance(value, str):
            raise ValueError(f"table[{key!r}]: mode must be a string, got {value!r}")
        try:
            modes[bucket] = Mode.parse(value).label
        except ValueError as exc:
            raise ValueError(f"table[{key!r}]: {exc}") from None
    return modes


def _count(value: Any) -> int | None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"must be an integer >= 1, got {value!r}")
    return value


class TableDocument(BaseModel):
    """One table file: the listed buckets' modes plus metadata (tp, vocab, dtype, provenance: any key)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    tp: Annotated[int | None, BeforeValidator(_count)] = Field(None, description="tensor-parallel size")
    vocab: Annotated[int | None, BeforeValidator(_count)] = Field(None, description="vocabulary size")
    dtype: str | None = Field(None, description="logits dtype the table was measured with")
    table: Annotated[dict[str, str], BeforeValidator(_bucket_modes)] = Field(
        description="bucket upper bound (\"1\", \"2\", ... \"32768\") -> mode; a missing bucket takes the nearest")

    @property
    def meta(self) -> dict[str, Any]:
        """Everything but the table, as written (unset tp/vocab/dtype left out)."""
        return self.model_dump(exclude={"table"}, exclude_none=True)

    def mode_table(self) -> ModeTable:
        return fill_nearest({bucket_from_upper_bound(int(b)): Mode.parse(m) for b, m in self.table.items()})


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
    doc = TableDocument(**meta, table=table.as_labels())
    path = Path(path)
    path.write_text(yaml.safe_dump({**doc.meta, "table": doc.table}, sort_keys=False, default_flow_style=False))
    return path


def read_table_file(path: str | Path) -> TableDocument:
    """Parse and validate a table file; every error is a ValueError that names the file and the key."""
    path = Path(path)
    doc = read_yaml_file(path)  # YAMLInputError (a ValueError) names the file; bounded, no aliases
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a mapping with a 'table' key, got {type(doc).__name__}")
    try:
        return TableDocument.model_validate({"table": None, **doc})  # a missing table gets the table's message
    except ValidationError as exc:
        raise ValueError(f"{path}: " + short_message(joined_errors(exc, _explain))) from None


def load_table_file(path: str | Path) -> ModeTable:
    """The starting table stored in `path` (see read_table_file for validation)."""
    return read_table_file(path).mode_table()


def _explain(error: ErrorDetails) -> str:
    message = error_text(error)
    key = error["loc"][0] if error["loc"] else None
    return message if key in (None, "table") else f"key {key!r} {message}"


def _as_int(key: Any) -> int:
    # YAML turns an unquoted 1 into an int and "1" into a str; accept both, nothing else
    if isinstance(key, bool):
        raise ValueError(f"bucket must be a power of two, got {key!r}")
    if isinstance(key, int):
        return key
    if isinstance(key, str) and key.strip().isdigit():
        return int(key)
    raise ValueError(f"bucket must be a power of two, got {key!r}")
