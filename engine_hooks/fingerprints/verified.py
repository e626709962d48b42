"""The verified releases: one generated JSON file per engine release in `data/`,
`{engine, version, points: {"module:qualname": {present, signature, hash}}}`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gatherwise.engine_hooks.fingerprints.fingerprint import Fingerprint
from gatherwise.engine_hooks.fingerprints.point import Point

DATA_DIR = Path(__file__).resolve().parent / "data"


@dataclass(frozen=True)
class Release:
    engine: str
    version: str
    points: Mapping[Point, Fingerprint]

    @property
    def label(self) -> str:
        return f"{self.engine} {self.version}"

    def to_json(self) -> dict[str, object]:
        points = {p.name: self.points[p].to_json() for p in sorted(self.points)}
        return {"engine": self.engine, "version": self.version, "points": points}

    @classmethod
    def from_json(cls, data: dict) -> Release:
        points = {Point.parse(name): Fingerprint.from_json(fp) for name, fp in data["points"].items()}
        return cls(str(data["engine"]), str(data["version"]), points)


def release_file(engine: str, version: str, data_dir: Path = DATA_DIR) -> Path:
    return data_dir / f"{engine}-{version}.json"


def write_release(release: Release, data_dir: Path = DATA_DIR) -> Path:
    path = release_file(release.engine, release.version, data_dir)
    path.write_text(json.dumps(release.to_json(), indent=1) + "\n", encoding="utf-8")
    return path


def verified_releases(engine: str, data_dir: Path = DATA_DIR) -> list[Release]:
    """Every verified release of `engine`, oldest file name first."""
    return [Release.from_json(json.loads(path.read_text(encoding="utf-8")))
            for path in sorted(data_dir.glob(f"{engine}-*.json"))]
