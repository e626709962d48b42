"""Small JSON files the engine writes for the sidecar (rank info files, hooks-off notices): one object with a
`format` number, written from a frozen dataclass, parsed defensively (the sidecar reads whatever is there).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any, TypeGuard


def record_json(record: Any, fmt: int) -> bytes:
    """A dataclass instance as one compact JSON object, its format number first."""
    return json.dumps({"format": fmt, **asdict(record)}, separators=(",", ":")).encode()


def parse_record(data: bytes, fmt: int, what: str) -> dict[str, Any]:
    """The JSON object of a file of this format; ValueError naming `what` for anything else."""
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(obj, dict) or obj.get("format") != fmt:
        raise ValueError(f"not a format-{fmt} {what}")
    return obj


def is_u63(value: object) -> TypeGuard[int]:
    """A JSON integer that fits the engine's counters and ids (bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63
