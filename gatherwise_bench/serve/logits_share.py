"""The logits path's share of the engine's time in one client run, from the sidecar's exact ring-header counters.

    share = max over ranks of Δ gatherwise_op_seconds_total{op="logits_path"} (every mode) / the client's duration

The header counters count every call (no sampled histograms, no dropped records on CPU), and the delta is taken
between two scrapes around the client run. While the server is busy its steps run back to back, so the wall time
of the run is the sum of its steps (plus what the server does between them), and the share is the fraction of the
step time spent from logits ready to tokens ready: collectives, sampling and gatherwise's bookkeeping. The rank
with the larger total is the one the step waited for.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gatherwise.sidecar.metrics import names

# the counters as a scrape exposes them (the sidecar names each family once, without the _total suffix)
OP_SECONDS, CALLS, TOPP_ROWS, TOPP_FALLBACK_ROWS = (
    f"{family}_total" for family in (names.OP_SECONDS, names.CALLS, names.TOPP_ROWS, names.TOPP_FALLBACK_ROWS))


def header_counters(metrics: str | list[str]) -> dict[str, dict[tuple[str, str], float]]:
    """{"path_seconds": {(rank, mode): s}, "calls": {(rank, mode): n}} from one /metrics scrape, or from one of
    each sidecar of a group across nodes (each exports its own node's ranks)."""
    out: dict[str, dict[tuple[str, str], float]] = {"path_seconds": {}, "calls": {}, "topp": {}}
    for text in [metrics] if isinstance(metrics, str) else metrics:
        _add_counters(text, out)
    return out


def _add_counters(metrics_text: str, out: dict[str, dict[tuple[str, str], float]]) -> None:
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == OP_SECONDS and labels.get("op") == "logits_path":
                out["path_seconds"][(labels["rank"], labels["mode"])] = sample.value
            elif sample.name == CALLS:
                out["calls"][(labels["rank"], labels["mode"])] = sample.value
            elif sample.name in (TOPP_ROWS, TOPP_FALLBACK_ROWS):
                # rank 0's sidecar alone exports these, so a sum over the sidecars of a group counts each row once
                key = ("rows" if sample.name == TOPP_ROWS else "fallback_rows", labels["engine"])
                out["topp"][key] = out["topp"].get(key, 0.0) + sample.value


def _delta(after: dict[tuple[str, str], float], before: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    return {key: value - before.get(key, 0.0) for key, value in after.items()}


def logits_share(before_text: str | list[str], after_text: str | list[str], duration_s: float) -> dict[str, Any]:
    """The share (definition above), the mean path time per call of the slower rank, rank 0's calls by mode
    (which modes really ran: calls that step aside from a pinned mode are recorded as what they ran), and the
    top-p rows sampled sharded with those of them whose nucleus outgrew the exchanged candidates (the fallback)."""
    before, after = header_counters(before_text), header_counters(after_text)
    path = _delta(after["path_seconds"], before["path_seconds"])
    calls = _delta(after["calls"], before["calls"])
    topp = _delta(after["topp"], before["topp"])
    topp_rows = {kind: int(sum(n for (k, _), n in topp.items() if k == kind)) for kind in ("rows", "fallback_rows")}
    path_by_rank: dict[str, float] = defaultdict(float)
    calls_by_rank: dict[str, float] = defaultdict(float)
    for (rank, _), seconds in path.items():
        path_by_rank[rank] += seconds
    for (rank, _), n in calls.items():
        calls_by_rank[rank] += n
    if not path_by_rank:
        return {"share": None, "path_seconds": None, "calls": 0, "path_us_per_call": None, "calls_by_mode": {},
                "topp_rows": topp_rows}
    slowest = max(path_by_rank, key=lambda rank: path_by_rank[rank])
    n_calls = calls_by_rank.get(slowest, 0.0)
    return {"share": path_by_rank[slowest] / duration_s if duration_s > 0 else None,
            "path_seconds": path_by_rank[slowest], "calls": int(n_calls),
            "path_us_per_call": 1e6 * path_by_rank[slowest] / n_calls if n_calls else None,
            "calls_by_mode": {mode: int(n) for (rank, mode), n in sorted(calls.items()) if rank == "0" and n},
            "topp_rows": topp_rows}
