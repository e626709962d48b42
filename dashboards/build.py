"""Generate the Grafana dashboard JSON from code (grafana-foundation-sdk, Grafana 11.6 schema).

`.venv/bin/python -m gatherwise.dashboards.build` rewrites dashboards/grafana/dashboards/;
tests/dashboards/test_dashboards.py regenerates into a temporary directory and fails when the committed JSON differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DashboardCursorSync

from gatherwise.dashboards.panels import (
    BUCKET_SOURCE,
    ENGINE,
    JAEGER_UID,
    PROM,
    PROMETHEUS_UID,
    health_panels,
    latency_panels,
    mode_panels,
    per_op_panels,
    traffic_panels,
    variable,
)

DASHBOARD_UID = "gatherwise-overview"
OUT_DIR = Path(__file__).parent / "grafana" / "dashboards"
__all__ = ["JAEGER_UID", "OUT_DIR", "PROMETHEUS_UID", "main", "render"]


def switch_annotation() -> dash.AnnotationQuery:
    return (
        dash.AnnotationQuery()
        .name("Mode switches")
        .datasource(PROM)
        .enable(True)
        .icon_color("purple")
        .expr(f"sum by (from, to, reason) (increase(gatherwise_mode_switches_total{{{ENGINE}}}[$__rate_interval])) > 0")
    )


# Prometheus annotation fields that the SDK's AnnotationQuery does not model; added to the JSON as Grafana stores them.
ANNOTATION_EXTRAS = {"titleFormat": "{{from}} → {{to}}", "textFormat": "reason: {{reason}}", "tagKeys": "reason"}


def overview() -> dict:
    builder = (
        dash.Dashboard("gatherwise — logits path")
        .uid(DASHBOARD_UID)
        .description("Which collective brings the vocab-sharded logits to the sampler, and what it costs right now.")
        .tags(["gatherwise"])
        .refresh("5s")
        .time("now-15m", "now")
        .timezone("browser")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .with_variable(variable("engine", "engine", "label_values(gatherwise_engine_up, engine)"))
        .with_variable(variable("rank", "rank", 'label_values(gatherwise_calls_total{engine=~"$engine"}, rank)'))
        .with_variable(variable("bucket", "bucket (rows ≤)", f"label_values({BUCKET_SOURCE}{{{ENGINE}}}, bucket)"))
        .annotation(switch_annotation())
    )
    sections = [
        ("Mode", mode_panels()),
        ("Latency", latency_panels()),
        ("Per operation", per_op_panels()),
        ("Traffic", traffic_panels()),
        ("Sidecar health", health_panels()),
    ]
    panel_id = 0
    for title, panels in sections:
        panel_id += 1
        builder.with_row(dash.Row(title).id(panel_id))
        for panel in panels:
            panel_id += 1
            builder.with_panel(panel.id(panel_id))
    data = json.loads(json.dumps(builder.build(), cls=JSONEncoder))
    for annotation in data["annotations"]["list"]:
        if annotation["name"] == "Mode switches":
            annotation.update(ANNOTATION_EXTRAS)
    return data


DASHBOARDS = {"gatherwise-overview.json": overview}


def render(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, make in DASHBOARDS.items():
        path = out_dir / name
        path.write_text(json.dumps(make(), indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="output directory (default: %(default)s)")
    args = parser.parse_args(argv)
    for path in render(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
