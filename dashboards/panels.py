"""Panels of the gatherwise dashboard: PromQL helpers and one function per dashboard row.

Every query filters on the `engine` variable; rates use `$__rate_interval`; latency panels ask for exemplars.
Modes and operations come from the mode enum and the ring format (every code the format defines, implemented or
not: a mode without traffic simply shows no data), so a mode the engine starts to implement appears on the
dashboard without regenerating it, and the committed JSON does not depend on what this checkout implements.
"""

from __future__ import annotations

from typing import cast

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

from gatherwise.modes import Mode
from gatherwise.shm_format.ring import MODE_OPS

Panel = timeseries.Panel | stat.Panel | statetimeline.Panel  # the panel builders this dashboard uses

PROMETHEUS_UID = "gw-prometheus"  # fixed in dashboards/grafana/provisioning/datasources/datasources.yml
JAEGER_UID = "gw-jaeger"
# The SDK's enums are Python 3.11 StrEnums; type-checked as 3.10 (the package's floor) their members read as str.
STACK_NORMAL = cast(common.StackingMode, common.StackingMode.NORMAL)

PROM = DataSourceRef(type_val="prometheus", uid=PROMETHEUS_UID)
ENGINE = 'engine=~"$engine"'
BUCKET = 'engine=~"$engine", bucket=~"$bucket"'
RANK = 'engine=~"$engine", rank=~"$rank"'
CRITICAL_P50 = "engine_mode_bucket:gatherwise_step_critical_path_seconds:p50_1m"  # recording rules
CRITICAL_P99 = "engine_mode_bucket:gatherwise_step_critical_path_seconds:p99_1m"
TOPP_FALLBACK_SHARE = "engine:gatherwise_topp_fallback_rows:ratio_rate5m"
BUCKET_SOURCE = "gatherwise_step_critical_path_seconds_count"
MODE_COLORS = {"all_gather": "blue", "gather": "orange", "sharded": "green"}
MODES = tuple(Mode)  # every mode code
OP_NAMES = tuple(dict.fromkeys(op for m in MODES for op in MODE_OPS[m] if op))
OPTIONAL_OPS = ("shard_resolve",)  # runs only in sharded calls with temperature-only or top-p rows


def query(expr: str, legend: str, ref: str = "A", exemplar: bool = False) -> prometheus.Dataquery:
    return (
        prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(PROM).exemplar(exemplar).range()
    )


def quantile(q: float, metric: str, by: str, selector: str) -> str:
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket{{{selector}}}[$__rate_interval])))"


def ratio_to_fastest(recorded: str) -> str:
    """Each mode's value over the fastest mode's in the same bucket: 1 is the fastest, 1.3 is 30 % slower."""
    return (
        f"max by (bucket, mode) ({recorded}{{{BUCKET}}})"
        f" / on (bucket) group_left () min by (bucket) ({recorded}{{{BUCKET}}})"
    )


def active_mode_code() -> str:
    """Per bucket, the code of the mode it runs (0 all_gather, 1 gather, 2 sharded): each mode's 0/1 gauge times
    its code, summed. label_replace keeps the terms apart for `or`; a mode without series adds nothing."""
    terms = [
        f'label_replace({int(m)} * max by (bucket) (gatherwise_active_mode{{{BUCKET}, mode="{m.label}"}}),'
        f' "code", "{int(m)}", "", "")'
        for m in MODES
    ]
    return "sum by (bucket) (" + " or ".join(terms) + ")"


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


def mode_panels() -> list[Panel]:
    by_mode = ValueMap(
        {
            str(int(m)): ValueMappingResult(text=m.label, color=MODE_COLORS[m.label], index=int(m))
            for m in MODES
        }
    )
    active = (
        statetimeline.Panel()
        .title("Active mode per bucket")
        .description("Mode the engine runs for each batch-size bucket (rows ≤ bucket).")
        .unit("none")
        .mappings([by_mode])
        .with_target(query(active_mode_code(), "≤{{bucket}} rows"))
        .merge_values(True)
        .show_value(common.VisibilityMode.NEVER)
        .height(8)
        .span(24)
    )
    estimates = (
        timeseries.Panel()
        .title("Policy estimate per bucket and mode")
        .description("The auto policy's current cost estimate for each mode (policy.cost: its step by default, "
                     "or its critical path); it switches on paired probes and a margin.")
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


def latency_panels() -> list[Panel]:
    critical = latency(
        "Critical path p50/p99 by mode and bucket",
        "Last rank in to last rank holding its tokens, per call; the cost the policy minimises.",
        "gatherwise_step_critical_path_seconds",
        "mode, bucket",
        BUCKET,
        "{{mode}} ≤{{bucket}}",
    )
    logits = latency(
        "Logits path p50/p99 by rank and mode",
        "Logits ready to tokens ready on each selected rank (every bucket): a straggling rank stands out here.",
        "gatherwise_logits_path_seconds",
        "rank, mode",
        RANK,
        "rank {{rank}} {{mode}}",
    )
    ratio = (
        timeseries.Panel()
        .title("Critical path per bucket relative to the fastest mode")
        .description("Each mode's recorded 1m p50 (and p99) over the fastest mode's in the same bucket: the "
                     "fastest is 1, a mode 30 % slower is 1.3.")
        .unit("suffix:×")
        .with_target(query(ratio_to_fastest(CRITICAL_P50), "{{mode}} ≤{{bucket}} p50", "A"))
        .with_target(query(ratio_to_fastest(CRITICAL_P99), "{{mode}} ≤{{bucket}} p99", "B"))
        .legend(legend_list())
    )
    skew = latency(
        "Cross-rank skew p50/p99 by mode",
        "Last rank in minus first rank in, per call: how long the fastest rank waits for the slowest.",
        "gatherwise_rank_skew_seconds",
        "mode",
        ENGINE,
        "{{mode}}",
    )
    # a TP group across nodes: each node's sidecar exports its own ranks' figures on its own clock, per node
    node_critical = latency(
        "Critical path per node p50/p99 (a group across nodes)",
        "On a TP group spread over nodes each node's sidecar sees only its own ranks: the critical path over "
        "them, per node (tp_node). Empty on a single node, where the panel above covers every rank.",
        "gatherwise_node_step_critical_path_seconds",
        "tp_node, mode",
        ENGINE,
        "node {{tp_node}} {{mode}}",
    )
    node_skew = latency(
        "Cross-rank skew per node p50/p99 (a group across nodes)",
        "The skew over one node's ranks, per node (tp_node); skew across nodes is not measured (their clocks "
        "differ). Empty on a single node.",
        "gatherwise_node_rank_skew_seconds",
        "tp_node, mode",
        ENGINE,
        "node {{tp_node}} {{mode}}",
    )
    return [p.height(9).span(12) for p in (critical, logits, ratio, skew, node_critical, node_skew)]


def per_op_panels() -> list[Panel]:
    panels = []
    for op in OP_NAMES:
        if op in OPTIONAL_OPS:
            continue  # shown with its mode's first collective: it only runs in some calls of that mode
        modes = [m for m in MODES if op in MODE_OPS[m]]
        optional = [o for m in modes for o in MODE_OPS[m] if o in OPTIONAL_OPS]
        ops = "|".join([op, *optional])
        title = f"{op} latency by bucket" if not optional else f"{' + '.join([op, *optional])} latency by bucket"
        panels.append(
            latency(
                title,
                f"Duration of {' and '.join([op, *optional])} ({', '.join(m.label for m in modes)} mode), pooled "
                "over the ranks (p50/p99 per selected bucket).",
                "gatherwise_collective_seconds",
                "op, bucket" if optional else "bucket",
                f'{BUCKET}, op=~"{ops}"',
                "{{op}} ≤{{bucket}}" if optional else "≤{{bucket}}",
            )
        )
    panels.append(
        latency(
            "sample latency by mode",
            "Sampling time on the ranks that sample (gather: rank 0; all_gather: every rank; sharded: every rank's "
            "shard reduction and search), over the selected buckets.",
            "gatherwise_sample_seconds",
            "mode",
            BUCKET,
            "{{mode}}",
        )
    )
    fallback = (
        timeseries.Panel()
        .title("Top-p fallback share (sharded)")
        .description("Of the top-p rows sampled in sharded mode, the share whose nucleus the exchanged candidates "
                     "did not cover, so every rank sampled them from the full row (exact, but slower).")
        .unit("percentunit")
        .with_target(query(f"max by (engine) ({TOPP_FALLBACK_SHARE}{{{ENGINE}}})", "{{engine}}"))
        .legend(legend_list())
    )
    return [p.height(8).span(6) for p in [*panels, fallback]]


def traffic_panels() -> list[Panel]:
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
        .stacking(StackingConfig().mode(STACK_NORMAL))
        .fill_opacity(30)
        .legend(legend_list())
    )
    return [p.height(8).span(12) for p in (bytes_, calls)]


def health_panels() -> list[Panel]:
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
    hooks_off = (
        stat.Panel()
        .title("Hooks off")
        .description("Engine processes with the plugin enabled whose hooks refused or never engaged, by engine and "
                     "reason (Model Runner V2, an unknown version, an unsupported feature, ...); the sidecar's "
                     "GET /v1/engine has the full text. 0 is what you want.")
        .unit("none")
        .with_target(query("sum by (engine_kind, reason) (gatherwise_engine_hooks_off)",
                           "{{engine_kind}} {{reason}}"))
    )
    return [*(p.height(6).span(6) for p in (engine_up, sidecar_up, heartbeat, dropped)), hooks_off.height(4).span(24)]
