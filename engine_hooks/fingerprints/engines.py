"""The engines gatherwise fingerprints, and one install of an engine checked against its verified releases."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gatherwise.engine_hooks.fingerprints import sglang_points, vllm_points
from gatherwise.engine_hooks.fingerprints.check import Engagement, engagements
from gatherwise.engine_hooks.fingerprints.fingerprint import Fingerprint, fingerprints
from gatherwise.engine_hooks.fingerprints.point import Point, RunnerPoints
from gatherwise.engine_hooks.fingerprints.source_tree import InstalledTree, SourceTree
from gatherwise.engine_hooks.fingerprints.verified import DATA_DIR, Release, verified_releases


@dataclass(frozen=True)
class Engine:
    name: str  # its top-level package, and the prefix of its data files
    label: str
    runners: tuple[RunnerPoints, ...]

    @property
    def points(self) -> tuple[Point, ...]:
        return tuple(sorted({p for r in self.runners for p in r.points}))

    def release(self, tree: SourceTree) -> Release:
        """The fingerprints of every point in `tree`, as a release record."""
        return Release(self.name, tree.version(self.name), fingerprints(tree, self.points))


ENGINES = {e.name: e for e in (Engine(vllm_points.ENGINE, "vLLM", vllm_points.RUNNERS),
                               Engine(sglang_points.ENGINE, "SGLang", sglang_points.RUNNERS))}


@dataclass(frozen=True)
class InstallCheck:
    engine: Engine
    version: str
    live: dict[Point, Fingerprint]
    engagements: list[Engagement]  # one per runner the install has

    def hooked(self) -> list[Engagement]:
        return [e for e in self.engagements if e.runner.hooked]

    def engagement(self, runner: str) -> Engagement | None:
        """The verdict for the runner named `runner` ("v1", "v2", ...); None when the install does not have it."""
        return next((e for e in self.engagements if e.runner.runner == runner), None)

    def runner_refusal(self, runner: str) -> str | None:
        """Why the hooks must stay off in a worker that runs the runner named `runner` (None: they may engage)."""
        engagement = self.engagement(runner)
        if engagement is None:
            return f"{self.engine.label} {self.version} has no {runner} runner by its fingerprints, yet this runs one"
        return None if engagement.engage else engagement.reason


def check_install(engine: Engine, tree: SourceTree | None = None, data_dir: Path = DATA_DIR) -> InstallCheck | None:
    """`engine` as installed in `tree` (default: where this interpreter imports it from) against its verified
    releases; None when it is not installed."""
    tree = tree or InstalledTree.live(engine.name)
    if tree is None:
        return None
    live = engine.release(tree)
    return InstallCheck(engine, live.version, dict(live.points),
                        engagements(engine.runners, live.points, verified_releases(engine.name, data_dir)))
