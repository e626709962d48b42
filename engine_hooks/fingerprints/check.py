"""The engagement check: a live install against the verified releases, per point and per runner.

A point's verdict: `match` (equal to its fingerprint in at least one verified release), `differs` (present, equal
to none) or `absent`. A runner engages when one verified release agrees with the live install at every point
the runner relies on — one release, not a patchwork of several, since the adapter was verified against each
release's code as a whole — and every required point is present.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gatherwise.engine_hooks.fingerprints.fingerprint import ABSENT, Fingerprint
from gatherwise.engine_hooks.fingerprints.point import Point, RunnerPoints
from gatherwise.engine_hooks.fingerprints.verified import Release

MATCH, DIFFERS, ABSENT_VERDICT = "match", "differs", "absent"


@dataclass(frozen=True)
class PointVerdict:
    point: Point
    verdict: str  # MATCH, DIFFERS or ABSENT_VERDICT
    releases: tuple[str, ...]  # the verified releases whose fingerprint of the point equals the live one
    live: Fingerprint

    def text(self) -> str:
        if self.verdict == MATCH:
            return f"{self.point.name}: matches {', '.join(self.releases)}"
        if self.verdict == ABSENT_VERDICT:
            return f"{self.point.name}: absent"
        return f"{self.point.name}: differs from every verified release (signature {self.live.signature})"


@dataclass(frozen=True)
class Engagement:
    runner: RunnerPoints
    engage: bool
    release: str | None  # the verified release that agrees at every point (None: none does)
    verdicts: tuple[PointVerdict, ...]
    reason: str  # why the hooks would not engage on this runner ("" when they would)

    def matched_text(self) -> str:
        """One line: the verified release the runner matched as a whole, its points that match, and those absent
        (optional points the release lacks too, when it engages)."""
        counts = {verdict: sum(v.verdict == verdict for v in self.verdicts) for verdict in (MATCH, ABSENT_VERDICT)}
        absent = f", {counts[ABSENT_VERDICT]} absent" if counts[ABSENT_VERDICT] else ""
        return f"{self.release or 'no verified release'}: {counts[MATCH]} of {len(self.verdicts)} points match{absent}"


def point_verdict(point: Point, live: Fingerprint, releases: Sequence[Release]) -> PointVerdict:
    agreeing = tuple(r.label for r in releases if r.points.get(point) == live)
    if not live.present:
        return PointVerdict(point, ABSENT_VERDICT, agreeing, live)
    return PointVerdict(point, MATCH if agreeing else DIFFERS, agreeing, live)


def runner_present(runner: RunnerPoints, live: Mapping[Point, Fingerprint]) -> bool:
    """Whether the install has the runner at all: a runner none of whose own points exist is not in it."""
    return any(live.get(p, ABSENT).present for p in runner.own)


def engagement(runner: RunnerPoints, live: Mapping[Point, Fingerprint], releases: Sequence[Release]) -> Engagement:
    verdicts = tuple(point_verdict(p, live.get(p, ABSENT), releases) for p in runner.points)
    if not runner.hooked:
        return Engagement(runner, False, None, verdicts,
                          f"gatherwise does not hook {runner.description}: the hooks step aside there")
    missing = [v for v in verdicts if v.point in runner.required and v.verdict == ABSENT_VERDICT]
    whole = [r for r in releases if all(r.points.get(v.point) == v.live for v in verdicts)]
    if whole and not missing:
        return Engagement(runner, True, whole[0].label, verdicts, "")
    # the release that agrees at the most points names the ones that keep the runner from engaging
    best = max(releases, key=lambda r: sum(r.points.get(v.point) == v.live for v in verdicts), default=None)
    off = [v for v in verdicts if best is None or best.points.get(v.point) != v.live or v in missing]
    names = "; ".join(_off_text(v) for v in off) or "no verified release"
    return Engagement(runner, False, None, verdicts, f"{runner.description}: {names}")


def _off_text(v: PointVerdict) -> str:
    if v.verdict == MATCH:
        return f"{v.point.name} matches only {', '.join(v.releases)}, not the release its other points match"
    return v.text()


def engagements(runners: Iterable[RunnerPoints], live: Mapping[Point, Fingerprint],
                releases: Sequence[Release]) -> list[Engagement]:
    """The verdict for every runner the install has."""
    return [engagement(r, live, releases) for r in runners if runner_present(r, live)]
