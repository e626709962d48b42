"""The name of every Prometheus family the sidecar exports, in one place (reference: docs/metrics.md).

The dashboards, alerts and checks use exactly these. Which module builds each family (under gatherwise.sidecar):
record histograms in metrics.record_histograms, header counters and engine gauges in metrics.header_counters, the
hooks-off gauge in metrics.hooks_off_gauge, the role gauge in metrics.role_gauge, the route info in
metrics.engine_route, the switch counter in control.decision_events, the control gauges in metrics.control_gauges;
metrics.exposition renders them all.
"""

from __future__ import annotations

# -- record histograms (fed from ring records by ingest) ---------------------------------------------------
COLLECTIVE_SECONDS = "gatherwise_collective_seconds"
SAMPLE_SECONDS = "gatherwise_sample_seconds"
LOGITS_PATH_SECONDS = "gatherwise_logits_path_seconds"
STEP_CRITICAL_PATH_SECONDS = "gatherwise_step_critical_path_seconds"
RANK_SKEW_SECONDS = "gatherwise_rank_skew_seconds"
# their node-local forms, for a sidecar that reads one node of a multi-node group (label tp_node)
NODE_STEP_CRITICAL_PATH_SECONDS = "gatherwise_node_step_critical_path_seconds"
NODE_RANK_SKEW_SECONDS = "gatherwise_node_rank_skew_seconds"
# -- ring-header counters and engine gauges (read at scrape time) --------------------------------------------
COLLECTIVE_BYTES = "gatherwise_collective_bytes"  # exposed as ..._total
CALLS = "gatherwise_calls"  # exposed as ..._total
RECORDS_DROPPED = "gatherwise_records_dropped"  # exposed as ..._total
TOPP_ROWS = "gatherwise_topp_rows"  # exposed as ..._total
TOPP_FALLBACK_ROWS = "gatherwise_topp_fallback_rows"  # exposed as ..._total
OP_SECONDS = "gatherwise_op_seconds"  # exposed as ..._total: the ring header's per-op time counters
LOGITS_PATH_BYTES = "gatherwise_logits_path_bytes"  # exposed as ..._total: the header's per-call bytes in total
ENGINE_UP = "gatherwise_engine_up"
ENGINE_HEARTBEAT_AGE_SECONDS = "gatherwise_engine_heartbeat_age_seconds"
ENGINE_HOOKS_OFF = "gatherwise_engine_hooks_off"  # engine processes whose hooks are off (their notices)
SIDECAR_ROLE = "gatherwise_sidecar_role"  # controller (its node holds the control block) or observer
ENGINE_ROUTE_INFO = "gatherwise_engine_route_info"  # each rank's runner, route and fingerprint verdict (info files)
# -- control families --------------------------------------------------------------------------------------
MODE_SWITCHES = "gatherwise_mode_switches"  # exposed as ..._total
ACTIVE_MODE = "gatherwise_active_mode"
POLICY_ESTIMATE_SECONDS = "gatherwise_policy_estimate_seconds"
