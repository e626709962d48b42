"""End to end: the stack without Docker (TP=2 engine, sidecar, real Prometheus with the compose's config and rules)
runs a mixed-sampling workload through every mode and some switches, next to an engine process whose hooks are
off (its hooks-off notice in the same shm_dir); then every PromQL expression of every dashboard panel,
annotation, variable and rule parses and returns data (but the per-node panels of a group across nodes, which a
one-node stack leaves empty), and latency exemplars carry trace ids.
"""

from __future__ import annotations

import itertools
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from gatherwise.dashboards import promql
from gatherwise.dashboards.local_prometheus import LocalPrometheus
from gatherwise.dashboards.local_stack import start_local_stack
from gatherwise.modes import IMPLEMENTED_LABELS
from tests._hooks_off import start_reporter, stop
from tests.conftest import require_tool

TOKEN = "stack-test-token"
DEADLINE_S = 150


class _AcceptEverything(BaseHTTPRequestHandler):
    """An OTLP/HTTP sink: the sidecar only puts trace ids into exemplars when it has somewhere to send traces."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def has_data(prometheus: LocalPrometheus, query: promql.Query, start: float) -> bool:
    """Alerts stay quiet in a healthy run, so for them every input selector must have data instead."""
    exprs = promql.selectors(query.expr) if "alert_rules" in query.source else [promql.substitute(query.expr)]
    for expr in exprs:
        answer = prometheus.api("query_range", query=expr, start=f"{start:.3f}", end=f"{time.time():.3f}", step="2")
        assert answer["status"] == "success", f"{query.source}: {answer.get('error')}\n{expr}"
        if not answer["data"]["result"]:
            return False
    return True


@pytest.mark.slow
@pytest.mark.timeout(DEADLINE_S + 120)
def test_every_query_returns_data_after_a_run_through_every_mode(tmp_path):
    require_tool("prometheus")
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _AcceptEverything)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    env = {
        "GATHERWISE_API_TOKEN": TOKEN,
        "GATHERWISE_TRACES_EVERY_NTH": "20",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink.server_address[1]}",
    }
    queries = promql.all_queries()
    stack_with_refused: list = []  # the process whose hooks are off, stopped whatever happens
    try:
        with start_local_stack(tmp_path, env=env) as stack:
            assert stack.prometheus is not None
            refused = start_reporter(str(stack.shm_dir))
            stack_with_refused.append(refused)
            start = time.time()
            client = httpx.Client(base_url=stack.sidecar_url, headers={"Authorization": f"Bearer {TOKEN}"})
            # a one-node stack exports no node-local family (only a sidecar reading part of a group across
            # nodes does: tests/sidecar/test_sidecar_multi_node.py), so the panels over them stay empty here
            missing = [q for q in queries if "gatherwise_node_" not in q.expr]
            for mode in itertools.cycle([*IMPLEMENTED_LABELS, "auto"]):
                answer = client.put("/v1/mode", params={"wait": 10}, json={"mode": mode})
                assert answer.status_code in (200, 202), answer.text
                time.sleep(2)
                missing = [q for q in missing if not has_data(stack.prometheus, q, start)]
                if not missing or time.time() - start > DEADLINE_S:
                    break
            assert not missing, "no data for:\n" + "\n".join(f"{q.source}: {q.expr}" for q in missing)
            exemplars = stack.prometheus.api(
                "query_exemplars",
                query="gatherwise_step_critical_path_seconds_bucket",
                start=f"{start:.3f}",
                end=f"{time.time():.3f}",
            )["data"]
            assert any(e["labels"].get("trace_id") for series in exemplars for e in series["exemplars"])
    finally:
        for proc in stack_with_refused:
            stop(proc)
        sink.shutdown()
