"""Prometheus config and rules pass promtool, and every alert has a unit test that sees it fire and stay quiet."""

from __future__ import annotations

import subprocess

import yaml

from gatherwise.dashboards import promql
from tests._repo import ROOT
from tests.conftest import require_tool

PROMETHEUS_DIR = ROOT / "dashboards" / "prometheus"
UNIT_TESTS = sorted((PROMETHEUS_DIR / "tests").glob("*.yml"))


def promtool(*args: str) -> subprocess.CompletedProcess:
    binary = require_tool("promtool")
    result = subprocess.run([binary, *args], cwd=PROMETHEUS_DIR, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result


def test_config_is_valid():
    promtool("check", "config", "prometheus.yml")


def test_rules_are_valid():
    promtool("check", "rules", "recording_rules.yml", "alert_rules.yml")


def test_rule_unit_tests_pass():
    assert UNIT_TESTS
    promtool("test", "rules", *(str(p) for p in UNIT_TESTS))


def test_every_alert_is_tested_firing_and_quiet():
    alerts = {q.source.split(": ")[1] for q in promql.rule_queries() if q.source.startswith("alert_rules")}
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in UNIT_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert alerts and alerts <= firing, f"alerts never seen firing: {sorted(alerts - firing)}"
    assert alerts <= quiet, f"alerts never checked quiet: {sorted(alerts - quiet)}"


def test_every_recording_rule_is_used():
    recorded = [q.source.split(": ")[1] for q in promql.rule_queries() if q.source.startswith("recording_rules")]
    users = [q.expr for q in promql.all_queries()]
    for name in recorded:
        assert any(name in expr for expr in users), f"recording rule {name} is computed but never read"
