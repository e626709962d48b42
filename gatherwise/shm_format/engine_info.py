"""Rank info files: what each TP rank says about itself that the ring header does not carry (docs/shm-format.md).

`<shm_dir>/<engine id>/info-<rank>.json`, written once by that rank at install time (0600, temporary name then
rename): the engine's kind and version, the model it serves, the node (host name) the rank runs on, its pid, the
sampler each mode uses there, and its route: the engine's runner class, the runner gatherwise recognised it as,
and what that runner's fingerprints matched. The sidecar only shows it (the live page, GET /v1/live, GET
/v1/engine, an info metric); nothing decides on it. So the reader is strict about size and types and clips every
string: the text is the engine's to choose, and a page shows it as text, never as markup. Stdlib only.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from gatherwise.shm_format.json_record import is_u63, parse_record, record_json
from gatherwise.shm_format.private_files import read_small_file, write_private_file

FORMAT = 1
PREFIX = "info-"
SUFFIX = ".json"
MAX_INFO_BYTES = 4096
MAX_TEXT_CHARS = 200
MAX_SAMPLER_MODES = 8
ROUTE_KEYS = frozenset(("runner", "route", "fingerprint"))


@dataclass(frozen=True)
class RankRoute:
    """Which of the engine's runners and logits routes is live on a rank; "" where the rank does not tell."""

    runner: str = ""  # the runner class, module and name (vllm.v1.worker.gpu.model_runner.GPUModelRunner)
    route: str = ""  # the runner gatherwise recognised it as ("vLLM's Model Runner V2 (...)")
    fingerprint: str = ""  # what its points matched ("vllm 0.34.0: 26 of 26 points match")


@dataclass(frozen=True)
class RankInfo:
    kind: str  # "gatherwise reference engine", "vLLM", "SGLang", ...
    version: str
    rank: int
    node: str
    pid: int
    sampler: dict[str, str] = field(default_factory=dict)  # mode label -> who samples in that mode
    model: str = ""  # the model the engine serves (its name or directory); "" when it did not say
    route: RankRoute = field(default_factory=RankRoute)

    def to_json(self) -> bytes:
        return record_json(self, FORMAT)

    @classmethod
    def from_json(cls, data: bytes) -> RankInfo:
        """Parse an info file; ValueError for anything that is not one."""
        obj = parse_record(data, FORMAT, "rank info file")
        kind, version, node = obj.get("kind"), obj.get("version"), obj.get("node")
        rank, pid, sampler, model = obj.get("rank"), obj.get("pid"), obj.get("sampler", {}), obj.get("model", "")
        route = obj.get("route", {})
        if not (isinstance(kind, str) and isinstance(version, str) and isinstance(node, str)
                and isinstance(model, str)):
            raise ValueError("kind, version, node or model missing or not a string")
        if not (is_u63(rank) and is_u63(pid)):
            raise ValueError("rank or pid not a non-negative integer")
        if not isinstance(sampler, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in sampler.items()):
            raise ValueError("sampler is not an object of strings")
        if not isinstance(route, dict) or set(route) - ROUTE_KEYS or not all(isinstance(v, str)
                                                                           for v in route.values()):
            raise ValueError(f"route is not an object of strings with keys among {sorted(ROUTE_KEYS)}")
        return cls(_clip(kind), _clip(version), rank, _clip(node), pid,
                   {_clip(k): _clip(v) for k, v in list(sampler.items())[:MAX_SAMPLER_MODES]}, _clip(model),
                   _clip_route(RankRoute(**route)))


def _clip(text: str) -> str:
    return text[:MAX_TEXT_CHARS]


def _clip_route(route: RankRoute) -> RankRoute:
    return RankRoute(_clip(route.runner), _clip(route.route), _clip(route.fingerprint))


def info_path(engine_dir: str | os.PathLike[str], rank: int) -> str:
    return os.path.join(os.fspath(engine_dir), f"{PREFIX}{rank}{SUFFIX}")


def write_rank_info(engine_dir: str | os.PathLike[str], rank: int, kind: str, version: str,
                    sampler: dict[str, str], model: str = "", route: RankRoute | None = None) -> RankInfo:
    """This process's info file for `rank` (OSError when it cannot be written)."""
    info = RankInfo(_clip(kind), _clip(version), rank, _clip(socket.gethostname()), os.getpid(),
                    {k: _clip(v) for k, v in sampler.items()}, _clip(model), _clip_route(route or RankRoute()))
    write_private_file(info_path(engine_dir, rank), info.to_json())
    return info


def read_rank_info(engine_dir: str | os.PathLike[str], rank: int) -> RankInfo | None:
    """The rank's info, or None where there is none or it is not one (never raises for the file)."""
    try:
        return RankInfo.from_json(read_small_file(info_path(engine_dir, rank), MAX_INFO_BYTES))
    except (OSError, ValueError):
        return None
