"""Checks of a whole machine (a GPU, two nodes): a registry of named checks, the rule that makes a run pass, a
runner under a time budget, and the report it writes (NAME.json with every number, summary.txt with one line per
check). Standard library only: it runs on bare machines without pytest; the checks import what they need.

A check takes the run's context (a dict: what the machine offers, and `left`, the seconds left in the budget) and
returns its result, a dict with a "status"; it raises Skip when it cannot run here, with the reason.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Context = dict[str, Any]
Result = dict[str, Any]
CheckFunction = Callable[[Context], Result]
Summary = Callable[[Result], str | None]  # the detail of a summary line; None: the result's reason or error

PASSING = ("pass", "skip")  # the statuses a passing run may contain (a skip always carries its reason)
MIN_SECONDS_TO_START = 20.0  # a check that would start with less of the budget left is skipped


class Skip(Exception):
    """A check that cannot run here (no GPU, a package missing); the reason goes into the report."""


def reason(result: Result) -> str:
    """Why a check skipped, failed or crashed, as its result says; empty when it does not."""
    return str(result.get("reason") or result.get("error") or "")


def _reason_only(result: Result) -> str | None:
    return None


@dataclass(frozen=True)
class Check:
    """One registered check: its name, the function that runs it, and the detail of its summary line."""

    name: str
    function: CheckFunction
    summary: Summary = _reason_only

    @property
    def description(self) -> str:
        return (self.function.__doc__ or "").strip().split("\n")[0]

    def summary_line(self, result: Result) -> str:
        detail = self.summary(result)
        return f"{self.name:15s} {result.get('status', '?'):5s} {reason(result) if detail is None else detail}"


class Checks:
    """The registry: checks in the order they were registered, which is the order a run takes them in."""

    def __init__(self) -> None:
        self._by_name: dict[str, Check] = {}

    def check(self, name: str, summary: Summary | None = None) -> Callable[[CheckFunction], CheckFunction]:
        def register(function: CheckFunction) -> CheckFunction:
            if name in self._by_name:
                raise ValueError(f"two checks named {name!r}")
            self._by_name[name] = Check(name, function, summary or _reason_only)
            return function
        return register

    def __iter__(self) -> Iterator[Check]:
        return iter(self._by_name.values())

    def __getitem__(self, name: str) -> Check:
        return self._by_name[name]

    def names(self) -> list[str]:
        return list(self._by_name)


def verdict(checks: dict[str, Result]) -> bool:
    """True when the run checked something and nothing failed: every status is in PASSING, at least one passed.
    A run that checked nothing (every check skipped, the budget spent before the first) is a failure."""
    statuses = [result.get("status") for result in checks.values()]
    return "pass" in statuses and all(status in PASSING for status in statuses)


class Budget:
    """Seconds for the whole run, counted from its start (environment and set-up included)."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.started = seconds, time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def left(self) -> float:
        return self.seconds - self.elapsed()


def run_checks(checks: Checks, context: Context, *, budget: Budget, only: Collection[str] | None = None,
               echo: Callable[[str], None] = lambda line: None) -> dict[str, Result]:
    """Each selected check in registration order, its result with its "seconds"; one check's failure or crash is
    recorded and the next one runs. `context["left"]` is the budget's seconds left."""
    context["left"] = budget.left
    results: dict[str, Result] = {}
    for check in checks:
        if only and check.name not in only:
            continue
        if budget.left() < MIN_SECONDS_TO_START:
            results[check.name] = {"status": "skip", "reason": "time budget spent"}
            continue
        started = time.monotonic()
        try:
            result = check.function(context)
        except Skip as why:
            result = {"status": "skip", "reason": str(why)}
        except Exception as exc:  # one check's failure must not hide the others
            result = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:600],
                      "traceback": traceback.format_exc()[-3000:]}
        result["seconds"] = round(time.monotonic() - started, 2)
        results[check.name] = result
        echo(check.summary_line(result))
    return results


def run(checks: Checks, outdir: Path, *, report_name: str, title: Callable[[dict[str, Any]], str],
        environment: Callable[[], dict[str, Any]], context: Context, budget: Budget,
        only: Collection[str] | None = None) -> dict[str, Any]:
    """The checks, then OUTDIR/REPORT_NAME.json (the environment, every result, elapsed_s, ok) and
    OUTDIR/summary.txt (the title, one line per check, the overall verdict). Returns the report."""
    report: dict[str, Any] = {"started_unix": time.time(), "environment": environment()}
    report["checks"] = run_checks(checks, context, budget=budget, only=only, echo=lambda line: print(line, flush=True))
    report["elapsed_s"] = round(budget.elapsed(), 1)
    report["ok"] = verdict(report["checks"])
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / f"{report_name}.json").write_text(json.dumps(report, indent=1, default=str))
    lines = [title(report), *(checks[name].summary_line(result) for name, result in report["checks"].items()),
             f"overall: {'ok' if report['ok'] else 'FAILURES'} (details: {report_name}.json)"]
    (outdir / "summary.txt").write_text("\n".join(lines) + "\n")
    return report


def list_checks(checks: Checks) -> str:
    return "\n".join(f"{check.name:15s} {check.description}".rstrip() for check in checks)


def main(checks: Checks, run_selected: Callable[[argparse.Namespace, list[str] | None], dict[str, Any]],
         argv: list[str] | None, *, prog: str, description: str, budget_s: float) -> int:
    """OUTDIR [--cpu] [--only a,b] [--budget S] [--list]: runs the selected checks, prints the summary, exits 0
    when the run passed and 1 when it did not."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("outdir", type=Path, nargs="?", help="where the report goes (required unless --list)")
    parser.add_argument("--cpu", action="store_true", help="run the checks on the CPU (no GPU parts)")
    parser.add_argument("--only", default="", help="comma-separated check names (default: all)")
    parser.add_argument("--budget", type=float, default=budget_s, help="seconds for all checks together")
    parser.add_argument("--list", action="store_true", help="name the checks, in the order they run, and exit")
    args = parser.parse_args(argv)
    if args.list:
        print(list_checks(checks))
        return 0
    if args.outdir is None:
        parser.error("OUTDIR is required")
    only = [c for c in args.only.split(",") if c] or None
    unknown = set(only or ()) - set(checks.names())
    if unknown:
        parser.error(f"unknown check(s): {', '.join(sorted(unknown))}")
    report = run_selected(args, only)
    print((args.outdir / "summary.txt").read_text(), end="")
    return 0 if report["ok"] else 1
