"""Panels of the gatherwise dashboard: PromQL helpers and one function per dashboard row.

Every query filters on the `engine` variable; rates use `$__rate_interval`; latency panels ask for exemplars.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus, stat, statetimeline, timeseries
from grafana_foundation_sdk.builders.common import StackingConfig, VizLegendOptions
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    ValueMap,
    ValueMappingResult,
    VariableRefresh,
    VariableSort,
)

PROMETHEUS_UID = "gw-prometheus"  # fixed in dashboards/grafana/provisioning/datasources/datasources.yml
JAEGER_UID = "gw-jaeger"

PROM = DataSourceRef(type_val="prometheus", uid=PROMETHEUS_UID)
ENGINE = 'engine=~"$engine"'
BUCKET = 'engine=~"$engine", bucket=~"$bucket"'
RANK_BUCKET = 'engine=~"$engine", rank=~"$rank", bucket=~"$bucket"'
RANK = 'engine=~"$engine", rank=~"$rank"'
CRITICAL_P50 = "engine_mode_bucket:gatherwise_step_critical_path_seconds:p50_1m"  # recording rules
CRITICAL_P99 = "engine_mode_bucket:gatherwise_step_critical_path_seconds:p99_1m"
BUCKET_SOURCE = "gatherwise_step_critical_path_seconds_count"
MODE_COLORS = {"all_gather": "blue", "gather": "orange"}


def query(expr: str, legend: str, ref: str = "A", exemplar: bool = False) -> prometheus.Dataquery:
    return (
        prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(PROM).exemplar(exemplar).range()
    )


def quantile(q: float, metric: str, by: str, selector: str) -> str:
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket{{{selector}}}[$__rate_interval])))"


def mode_ratio(recorded: str) -> str:
    return (
        f'max by (bucket) ({recorded}{{{BUCKET}, mode="all_gather"}})'
        f' / max by (bucket) ({recorded}{{{BUCKET}, mode="gather"}})'
    )


def latency(title: str, description: str, metric: str, by: str, selector: str, legend: str) -> timeseries.Panel:
    """p50 and p99 of a histogram; exemplars on, so a dot links to the call's trace in Jaeger."""
    return (
        timeseries.Panel()
        .title(title)
        .description(description)
        .unit("s")
        .with_target(query(quantile(0.5, metric, by, selector), f"{legend} p50", "A", exemplar=True))
        .with_target(query(quantile(0.99, metric, by, selector), f"{legend} p99", "B", exemplar=True))
        .legend(legend_list())
    )


def legend_list() -> VizLegendOptions:
    return (
        VizLegendOptions()
        .show_legend(True)
        .display_mode(common.LegendDisplayMode.LIST)
        .placement(common.LegendPlacement.BOTTOM)
    )


def variable(name: str, label: str, expr: str) -> dash.QueryVariable:
    return (
        dash.QueryVariable(name)
        .label(label)
        .datasource(PROM)
        .query({"query": expr, "refId": f"{name}-values"})
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.NATURAL_ASC)
    )


def mode_panels() -> list[object]:
    by_mode = ValueMap(
        {
            "0": ValueMappingResult(text="all_gather", color=MODE_COLORS["all_gather"], index=0),
            "1": ValueMappingResult(text="gather", color=MODE_COLORS["gather"], index=1),
        }
    )
    active = (
        statetimeline.Panel()
        .title("Active mode per bucket")
        .description("Mode the engine runs for each batch-size bucket (rows ≤ bucket).")
        .unit("none")
        .mappings([by_mode])
        .with_target(query(f'max by (bucket) (gatherwise_active_mode{{{BUCKET}, mode="gather"}})', "≤{{bucket}} rows"))
        .merge_values(True)
        .show_value(common.VisibilityMode.NEVER)
        .height(8)
        .span(24)
    )
    estimates = (
        timeseries.Panel()
        .title("Policy estimate per bucket: gather vs all_gather")
        .description("The auto policy's current critical-path estimate for each mode; it switches on a margin.")
        .unit("s")
        .with_target(
            query(
                f"max by (mode, bucket) (gatherwise_policy_estimate_seconds{{{BUCKET}}})",
                "{{mode}} ≤{{bucket}}",
            )
        )
        .legend(legend_list())
        .height(8)
        .span(12)
    )
    switches = (
        timeseries.Panel()
        .title("Mode switches by reason")
        .description("Switches per rate window: manual (API), auto (policy), probe (bounded exploration).")
        .unit("short")
        .with_target(
            query(
                f"sum by (reason) (increase(gatherwise_mode_switches_total{{{ENGINE}}}[$__rate_interval]))",
                "{{reason}}",
            )
        )
        .draw_style(common.GraphDrawStyle.BARS)
        .legend(legend_list())
        .height(8)
        .span(12)
    )
    return [active, estimates, switches]


def latency_panels() -> list[object]:
    critical = latency(
        "Critical path p50/p99 by mode and bucket",
        "Last rank in to last rank holding its tokens, per call; the cost the policy minimises.",
        "gatherwise_step_critical_path_seconds",
        "mode, bucket",
        BUCKET,
        "{{mode}} ≤{{bucket}}",
    )
    logits = latency(
        "Logits path p50/p99 by mode and bucket",
        "Logits ready to tokens ready on each selected rank, pooled across those ranks.",
        "gatherwise_logits_path_seconds",
        "mode, bucket",
        RANK_BUCKET,
        "{{mode}} ≤{{bucket}}",
    )
    ratio = (
        timeseries.Panel()
        .title("Critical path ratio all_gather / gather per bucket")
        .description("Above 1: gather is faster in that bucket (recorded 1m p50 and p99 of each mode).")
        .unit("suffix:×")
        .with_target(query(mode_ratio(CRITICAL_P50), "≤{{bucket}} p50", "A"))
        .with_target(query(mode_ratio(CRITICAL_P99), "≤{{bucket}} p99", "B"))
        .legend(legend_list())
    )
    skew = latency(
        "Cross-rank skew p50/p99 by mode",
        "Last rank in minus first rank in, per call: how long the fastest rank waits for the slowest.",
        "gatherwise_rank_skew_seconds",
        "mode",
        BUCKET,
        "{{mode}}",
    )
    return [p.height(9).span(12) for p in (critical, logits, ratio, skew)]


def per_op_panels() -> list[object]:
    panels = []
    for op in ("all_gather", "gather", "broadcast"):
        panels.append(
            latency(
                f"{op} latency by rank",
                f"Duration of the {op} collective per rank (p50/p99 over the selected buckets).",
                "gatherwise_collective_seconds",
                "rank",
                f'{RANK_BUCKET}, op="{op}"',
                "rank {{rank}}",
            )
        )
    panels.append(
        latency(
            "sample latency by rank",
            "Sampling time per rank (in gather mode only rank 0 samples).",
            "gatherwise_sample_seconds",
            "rank, mode",
            RANK_BUCKET,
            "rank {{rank}} {{mode}}",
        )
    )
    return [p.height(8).span(6) for p in panels]


def traffic_panels() -> list[object]:
    bytes_ = (
        timeseries.Panel()
        .title("Collective bytes/s by mode and op")
        .description("Bytes moved by the logits collectives on the selected ranks.")
        .unit("Bps")
        .with_target(
            query(
                f"sum by (mode, op) (rate(gatherwise_collective_bytes_total{{{RANK}}}[$__rate_interval]))",
                "{{mode}} {{op}}",
            )
        )
        .legend(legend_list())
    )
    calls = (
        timeseries.Panel()
        .title("Logits calls/s by mode")
        .description("Every rank makes the same calls, so the busiest selected rank is the engine's call rate.")
        .unit("ops")
        .with_target(
            query(
                f"max by (mode) (rate(gatherwise_calls_total{{{RANK}}}[$__rate_interval]))",
                "{{mode}}",
            )
        )
        .stacking(StackingConfig().mode(common.StackingMode.NORMAL))
        .fill_opacity(30)
        .legend(legend_list())
    )
    return [p.height(8).span(12) for p in (bytes_, calls)]


def health_panels() -> list[object]:
    down, up = (
        ValueMappingResult(text="down", color="red", index=0),
        ValueMappingResult(text="up", color="green", index=1),
    )
    up_map = ValueMap({"0": down, "1": up})
    engine_up = (
        stat.Panel()
        .title("Engine up")
        .description("1 while the sidecar sees a live engine instance.")
        .unit("none")
        .mappings([up_map])
        .with_target(query(f"max by (engine) (gatherwise_engine_up{{{ENGINE}}})", "{{engine}}"))
    )
    sidecar_up = (
        stat.Panel()
        .title("Sidecar scrape up")
        .description("1 while Prometheus can scrape the sidecar's /metrics.")
        .unit("none")
        .mappings([up_map])
        .with_target(query('up{job="gatherwise-sidecar"}', "{{instance}}"))
    )
    heartbeat = (
        timeseries.Panel()
        .title("Engine heartbeat age")
        .description("Seconds since rank 0 last stamped the control block's heartbeat; alert above 10 s.")
        .unit("s")
        .with_target(query(f"max by (engine) (gatherwise_engine_heartbeat_age_seconds{{{ENGINE}}})", "{{engine}}"))
        .legend(legend_list())
    )
    dropped = (
        timeseries.Panel()
        .title("Records dropped/s")
        .description("Ring records overwritten before the sidecar read them (header counters stay exact).")
        .unit("cps")
        .with_target(
            query(
                f"sum by (rank) (rate(gatherwise_records_dropped_total{{{RANK}}}[$__rate_interval]))",
                "rank {{rank}}",
            )
        )
        .legend(legend_list())
    )
    return [p.height(6).span(6) for p in (engine_up, sidecar_up, heartbeat, dropped)]
