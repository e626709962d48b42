"""Every PromQL expression the local stack runs: dashboard panels, annotations, variables and rules.

Tests evaluate each one against a real Prometheus, so a renamed metric or a typo in a panel fails a test
instead of showing an empty graph. Grafana variables are replaced by values Prometheus accepts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).parent
DASHBOARD_DIR = ROOT / "grafana" / "dashboards"
RULE_FILES = (ROOT / "prometheus" / "recording_rules.yml", ROOT / "prometheus" / "alert_rules.yml")

# What Grafana puts in place of its variables when every value is selected (the variables' allValue is ".*").
GRAFANA_DEFAULTS = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "15m",
    "$engine": ".*",
    "$rank": ".*",
    "$bucket": ".*",
}
LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>\w+)\)$")


@dataclass(frozen=True)
class Query:
    source: str  # e.g. "gatherwise-overview.json: panel 'Engine up' A" or "alert_rules.yml: GatherwiseRecordsDropped"
    expr: str  # as written, with Grafana variables


def substitute(expr: str, values: dict[str, str] | None = None) -> str:
    """Replace Grafana variables, longest name first so that no name replaces part of a longer one."""
    merged = {**GRAFANA_DEFAULTS, **(values or {})}
    for name in sorted(merged, key=len, reverse=True):
        expr = expr.replace(name, merged[name])
    return expr


def dashboard_queries(directory: Path = DASHBOARD_DIR) -> list[Query]:
    queries: list[Query] = []
    for path in sorted(directory.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        for panel in data.get("panels", []):
            for target in panel.get("targets") or []:
                queries.append(Query(f"{path.name}: panel {panel['title']!r} {target['refId']}", target["expr"]))
        for annotation in data.get("annotations", {}).get("list", []):
            if annotation.get("expr"):
                queries.append(Query(f"{path.name}: annotation {annotation['name']!r}", annotation["expr"]))
        for variable in data.get("templating", {}).get("list", []):
            match = LABEL_VALUES.match(variable["query"]["query"])
            if match is None:
                raise ValueError(f"{path.name}: variable {variable['name']!r} is not label_values(selector, label)")
            # label_values() is Grafana's; the selector inside it is the PromQL part.
            queries.append(Query(f"{path.name}: variable {variable['name']!r}", match["selector"]))
    return queries


def rule_queries(files: tuple[Path, ...] = RULE_FILES) -> list[Query]:
    queries: list[Query] = []
    for path in files:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            for rule in group["rules"]:
                name = rule.get("record") or rule["alert"]
                queries.append(Query(f"{path.name}: {name}", rule["expr"].strip()))
    return queries


def all_queries() -> list[Query]:
    return dashboard_queries() + rule_queries()


SELECTOR = re.compile(r"\b(?:up|(?:[a-z_]+:)?gatherwise_[a-z_]+(?::[a-z0-9_]+)?)(?:\{[^}]*\})?")


def selectors(expr: str) -> list[str]:
    """The series selectors in an expression: an alert's expression is empty while all is well, its inputs are not."""
    return sorted(set(SELECTOR.findall(expr)))
