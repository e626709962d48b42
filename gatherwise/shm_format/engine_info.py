"""Rank info files: what each TP rank says about itself that the ring header does not carry (docs/shm-format.md).

`<shm_dir>/<engine id>/info-<rank>.json`, written once by that rank at install time (0600, temporary name then
rename): the engine's kind and version, the node (host name) the rank runs on, its pid and the sampler each mode
uses there. The sidecar only shows it (the live page, GET /v1/live); nothing decides on it. So the reader is
strict about size and types and clips every string: the text is the engine's to choose, and a page shows it as
text, never as markup. Stdlib only.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass, field
from typing import TypeGuard

from gatherwise.shm_format.private_files import read_small_file, write_private_file

FORMAT = 1
PREFIX = "info-"
SUFFIX = ".json"
MAX_INFO_BYTES = 4096
MAX_TEXT_CHARS = 200
MAX_SAMPLER_MODES = 8


@dataclass(frozen=True)
class RankInfo:
    kind: str  # "gatherwise reference engine", "vLLM", "SGLang", ...
    version: str
    rank: int
    node: str
    pid: int
    sampler: dict[str, str] = field(default_factory=dict)  # mode label -> who samples in that mode

    def to_json(self) -> bytes:
        return json.dumps({"format": FORMAT, **asdict(self)}, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> RankInfo:
        """Parse an info file; ValueError for anything that is not one."""
        try:
            obj = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not JSON ({exc})") from None
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise ValueError("not a format-1 rank info file")
        kind, version, node = obj.get("kind"), obj.get("version"), obj.get("node")
        rank, pid, sampler = obj.get("rank"), obj.get("pid"), obj.get("sampler", {})
        if not (isinstance(kind, str) and isinstance(version, str) and isinstance(node, str)):
            raise ValueError("kind, version or node missing or not a string")
        if not (_is_int(rank) and _is_int(pid)):
            raise ValueError("rank or pid not a non-negative integer")
        if not isinstance(sampler, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in sampler.items()):
            raise ValueError("sampler is not an object of strings")
        return cls(_clip(kind), _clip(version), rank, _clip(node), pid,
                   {_clip(k): _clip(v) for k, v in list(sampler.items())[:MAX_SAMPLER_MODES]})


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _clip(text: str) -> str:
    return text[:MAX_TEXT_CHARS]


def info_path(engine_dir: str | os.PathLike[str], rank: int) -> str:
    return os.path.join(os.fspath(engine_dir), f"{PREFIX}{rank}{SUFFIX}")


def write_rank_info(engine_dir: str | os.PathLike[str], rank: int, kind: str, version: str,
                    sampler: dict[str, str]) -> RankInfo:
    """This process's info file for `rank` (OSError when it cannot be written)."""
    info = RankInfo(_clip(kind), _clip(version), rank, _clip(socket.gethostname()), os.getpid(),
                    {k: _clip(v) for k, v in sampler.items()})
    write_private_file(info_path(engine_dir, rank), info.to_json())
    return info


def read_rank_info(engine_dir: str | os.PathLike[str], rank: int) -> RankInfo | None:
    """The rank's info, or None where there is none or it is not one (never raises for the file)."""
    try:
        return RankInfo.from_json(read_small_file(info_path(engine_dir, rank), MAX_INFO_BYTES))
    except (OSError, ValueError):
        return None
