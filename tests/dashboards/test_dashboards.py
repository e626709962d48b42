"""Grafana dashboards: the committed JSON is what the generator writes, and every panel is well-formed.

The last test starts the real Prometheus with the stack's rules and checks every dashboard and rule query parses.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from gatherwise.dashboards import build, promql
from gatherwise.dashboards.local_prometheus import start_prometheus, write_local_config
from tests._dist import free_port
from tests._repo import ROOT
from tests.conftest import require_tool

DATASOURCES = ROOT / "dashboards" / "grafana" / "provisioning" / "datasources" / "datasources.yml"
PROVIDERS = ROOT / "dashboards" / "grafana" / "provisioning" / "dashboards" / "dashboards.yml"
# Families from issues 3 and 4, plus the recording rules' outputs.
# Series of engine processes whose hooks are off: such a process has no engine id, so they carry no engine label.
NO_ENGINE_LABEL = {"gatherwise_engine_hooks_off"}
KNOWN_METRICS = {
    "gatherwise_collective_seconds",
    "gatherwise_sample_seconds",
    "gatherwise_logits_path_seconds",
    "gatherwise_step_critical_path_seconds",
    "gatherwise_rank_skew_seconds",
    "gatherwise_node_step_critical_path_seconds",  # a TP group across nodes: each node's own ranks
    "gatherwise_node_rank_skew_seconds",
    "gatherwise_collective_bytes_total",
    "gatherwise_calls_total",
    "gatherwise_records_dropped_total",
    "gatherwise_topp_rows_total",
    "gatherwise_topp_fallback_rows_total",
    "gatherwise_engine_up",
    "gatherwise_engine_heartbeat_age_seconds",
    "gatherwise_engine_hooks_off",
    "gatherwise_mode_switches_total",
    "gatherwise_active_mode",
    "gatherwise_policy_estimate_seconds",
}
REQUIRED_TITLES = {
    "Active mode per bucket",
    "Policy estimate per bucket and mode",
    "Critical path p50/p99 by mode and bucket",
    "Critical path per bucket relative to the fastest mode",
    "Logits path p50/p99 by rank and mode",
    "Cross-rank skew p50/p99 by mode",
    "all_gather latency by bucket",
    "gather latency by bucket",
    "broadcast latency by bucket",
    "shard_exchange + shard_resolve latency by bucket",
    "sample latency by mode",
    "Top-p fallback share (sharded)",
    "Collective bytes/s by mode and op",
    "Logits calls/s by mode",
    "Engine up",
    "Engine heartbeat age",
    "Records dropped/s",
}


def dashboards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(build.OUT_DIR.glob("*.json"))}


def panels() -> list[dict]:
    return [p for d in dashboards().values() for p in d["panels"] if p["type"] != "row"]


def test_committed_json_is_what_the_generator_writes(tmp_path):
    written = build.render(tmp_path)
    assert {p.name for p in written} == set(dashboards()), "a dashboard file is missing or stale"
    for path in written:
        committed = (build.OUT_DIR / path.name).read_text()
        assert path.read_text() == committed, (
            f"{path.name} differs: run `.venv/bin/python -m gatherwise.dashboards.build`")


def test_required_panels_exist_with_units_and_the_fixed_datasource():
    assert {p["title"] for p in panels()} >= REQUIRED_TITLES
    for panel in panels():
        assert panel["fieldConfig"]["defaults"].get("unit"), f"panel {panel['title']!r} has no unit"
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": build.PROMETHEUS_UID}


def test_rates_use_rate_interval_and_latency_panels_link_exemplars():
    for query in promql.dashboard_queries():
        windows = re.findall(r"\b(?:rate|increase)\([^\[]*\[([^\]]+)\]", query.expr)
        assert all(w == "$__rate_interval" for w in windows), f"{query.source}: {query.expr}"
    for panel in panels():
        if any("histogram_quantile" in t["expr"] and "_bucket{" in t["expr"] for t in panel["targets"]):
            assert all(t["exemplar"] for t in panel["targets"]), f"panel {panel['title']!r} hides exemplars"


def test_variables_and_selectors():
    for data in dashboards().values():
        names = [v["name"] for v in data["templating"]["list"]]
        assert {"engine", "rank"} <= set(names)
    for query in promql.dashboard_queries():
        if any(name in query.expr for name in NO_ENGINE_LABEL):  # no engine id exists for these: never filter by it
            assert "$engine" not in query.expr, f"{query.source} filters by a label its series do not have"
        elif "gatherwise_" in query.expr and "variable 'engine'" not in query.source:
            assert 'engine=~"$engine"' in query.expr, f"{query.source} ignores the engine variable"
        if "rank=" in query.expr or "by (rank" in query.expr:
            assert 'rank=~"$rank"' in query.expr, f"{query.source} ignores the rank variable"


def test_only_known_metric_names():
    recorded = {q.source.split(": ")[1] for q in promql.rule_queries() if "recording" in q.source}
    for query in promql.all_queries():
        for name in re.findall(r"\b(?:[a-z_]+:)?gatherwise_[a-z_]+(?::[a-z0-9_]+)?", query.expr):
            base = re.sub(r"_(bucket|count|sum)$", "", name)
            assert base in KNOWN_METRICS or name in recorded, f"{query.source}: unknown metric {name}"


def test_mode_switch_annotation_shows_the_reason():
    for data in dashboards().values():
        (switches,) = [a for a in data["annotations"]["list"] if a["name"] == "Mode switches"]
        assert "gatherwise_mode_switches_total" in switches["expr"]
        assert "reason" in switches["tagKeys"] and "{{reason}}" in switches["textFormat"]


def test_provisioning_matches_the_dashboards():
    sources = {s["uid"]: s for s in yaml.safe_load(DATASOURCES.read_text())["datasources"]}
    assert sources[build.PROMETHEUS_UID]["type"] == "prometheus"
    assert sources[build.JAEGER_UID]["type"] == "jaeger"
    (link,) = sources[build.PROMETHEUS_UID]["jsonData"]["exemplarTraceIdDestinations"]
    assert link == {"name": "trace_id", "datasourceUid": build.JAEGER_UID}
    (provider,) = yaml.safe_load(PROVIDERS.read_text())["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]


@pytest.mark.timeout(60)
def test_every_dashboard_and_rule_query_parses_in_prometheus(tmp_path):
    require_tool("prometheus")
    # Nothing listens on the target: the point here is parsing; tests with a live sidecar check the data.
    config = write_local_config(tmp_path / "config", [f"127.0.0.1:{free_port()}"])
    server = start_prometheus(config, tmp_path / "data", free_port())
    try:
        rules = server.api("rules")["data"]["groups"]
        assert sum(len(g["rules"]) for g in rules) == len(promql.rule_queries())
        for query in promql.all_queries():
            answer = server.query(promql.substitute(query.expr))
            assert answer["status"] == "success", f"{query.source}: {answer.get('error')}\n{query.expr}"
    finally:
        server.stop()


def test_every_panel_is_explained_in_the_docs():
    text = (ROOT / "docs" / "dashboards.md").read_text()
    for panel in panels():
        assert f"**{panel['title']}**" in text, f"docs/dashboards.md does not explain {panel['title']!r}"
