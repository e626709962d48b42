"""The GPU check's own logic, on the CPU: what makes a run pass, and the report it writes. A run that checked
nothing (every check skipped, the time budget spent before the first) must fail, like pytest's exit 5 ("no tests
collected"); a failing or crashing check fails the run without hiding the checks after it.

What the checks establish on a GPU is recorded by scripts/gpu_check.sh itself (gpu_check.json); the same logic
runs on the CPU in test_gpu_check.py (the script, --cpu), test_deferred_word.py, test_graphs.py and
test_cuda_timing.py. The rule and the report are tests.machine.harness's, shared with the two-node check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.machine import gpu_checks
from tests.machine.harness import CheckFunction, Checks, Skip, verdict


@pytest.mark.parametrize(("statuses", "ok"), [
    (("pass", "pass"), True),
    (("pass", "skip"), True),
    (("skip", "skip"), False),  # checked nothing
    ((), False),
    (("pass", "fail"), False),
    (("pass", "error"), False),
    (("pass", None), False),  # a result without a status is not a pass
])
def test_the_verdict(statuses, ok):
    checks = {f"c{i}": ({} if s is None else {"status": s}) for i, s in enumerate(statuses)}
    assert verdict(checks) is ok


def _passes(ctx: dict) -> dict:
    return {"status": "pass", "calls": 3}


def _fails(ctx: dict) -> dict:
    return {"status": "fail", "reason": "tokens differ"}


def _crashes(ctx: dict) -> dict:
    raise RuntimeError("boom")


def _skips(ctx: dict) -> dict:
    raise Skip("needs CUDA")


def _registry(checks: list[tuple[str, CheckFunction]]) -> Checks:
    registry = Checks()
    for name, function in checks:
        registry.check(name)(function)
    return registry


def _run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, checks: list[tuple[str, CheckFunction]],
         **kwargs: Any) -> tuple[dict, str]:
    monkeypatch.setattr(gpu_checks, "CHECKS", _registry(checks))
    report = gpu_checks.run(tmp_path, cpu=True, **kwargs)
    assert json.loads((tmp_path / "gpu_check.json").read_text())["ok"] is report["ok"]
    return report, (tmp_path / "summary.txt").read_text()


def test_a_failing_or_crashing_check_fails_the_run_and_the_others_still_run(monkeypatch, tmp_path):
    report, summary = _run(monkeypatch, tmp_path, [("a", _passes), ("b", _fails), ("c", _crashes), ("d", _skips)])
    checks = report["checks"]
    assert list(checks) == ["a", "b", "c", "d"] and report["ok"] is False
    assert [checks[n]["status"] for n in checks] == ["pass", "fail", "error", "skip"]
    assert checks["c"]["error"] == "RuntimeError: boom" and "Traceback" in checks["c"]["traceback"]
    assert checks["d"]["reason"] == "needs CUDA"
    assert all(isinstance(c["seconds"], float) for c in checks.values())
    lines = summary.splitlines()
    assert lines[0].startswith("gatherwise gpu check on CPU (fallback)") and len(lines) == 1 + len(checks) + 1
    assert lines[-1] == "overall: FAILURES (details: gpu_check.json)"


def test_a_run_that_checked_nothing_fails(monkeypatch, tmp_path):
    report, summary = _run(monkeypatch, tmp_path, [("a", _skips), ("b", _skips)])
    assert report["ok"] is False and "overall: FAILURES" in summary


def test_a_spent_budget_skips_the_rest_and_checks_nothing(monkeypatch, tmp_path):
    report, _ = _run(monkeypatch, tmp_path, [("a", _passes)], budget_s=0.0)
    assert report["checks"]["a"] == {"status": "skip", "reason": "time budget spent"} and report["ok"] is False


def test_a_passing_run_exits_0_and_a_failing_one_1(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_checks, "CHECKS", _registry([("a", _passes), ("b", _fails)]))
    assert gpu_checks.main([str(tmp_path / "one"), "--cpu", "--only", "a"]) == 0
    assert gpu_checks.main([str(tmp_path / "two"), "--cpu"]) == 1
    assert "overall: ok" in (tmp_path / "one" / "summary.txt").read_text()


def test_the_checks_are_listed_from_their_registry_in_the_order_they_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_checks.main(["--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == gpu_checks.CHECKS.names()
    assert all(len(line.split()) > 1 for line in listed)  # each named with what it checks


def test_each_summary_line_is_written_by_its_own_check() -> None:
    registry = Checks()
    registry.check("counted", summary=lambda result: f"{result['calls']} calls" if "calls" in result else None)(_passes)
    check = registry["counted"]
    assert check.summary_line({"status": "pass", "calls": 3}) == f"{'counted':15s} pass  3 calls"
    assert check.summary_line({"status": "skip", "reason": "needs CUDA"}) == f"{'counted':15s} skip  needs CUDA"
    with pytest.raises(ValueError, match="two checks named"):
        registry.check("counted")(_fails)
