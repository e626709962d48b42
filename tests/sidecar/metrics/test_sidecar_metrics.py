"""A real TP=2 `gatherwise engine` + a real uvicorn sidecar: /metrics families, labels and exact counts;
promtool lints the exposition; a real Prometheus scrapes it and answers per-rank, per-op PromQL."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import pytest

from gatherwise.modes import NUM_BUCKETS, bucket_label
from gatherwise.sidecar.metrics.header_counters import bytes_series
from tests._dist import free_port
from tests._sidecar import OPENMETRICS, samples, scrape, start_engine, start_sidecar, total, wait_for
from tests.conftest import require_tool

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

HISTOGRAMS = {  # per rank only where a rank matters, per bucket only where the policy decides
    "gatherwise_collective_seconds": {"engine", "op", "mode", "bucket"},
    "gatherwise_sample_seconds": {"engine", "mode", "bucket"},
    "gatherwise_logits_path_seconds": {"engine", "rank", "mode"},
    "gatherwise_step_critical_path_seconds": {"engine", "mode", "bucket"},
    "gatherwise_rank_skew_seconds": {"engine", "mode"},
}
SCALARS = {
    "gatherwise_collective_bytes_total": {"engine", "rank", "op", "mode"},
    "gatherwise_calls_total": {"engine", "rank", "mode"},
    "gatherwise_records_dropped_total": {"engine", "rank", "reason"},
    "gatherwise_op_seconds_total": {"engine", "rank", "op", "mode"},
    "gatherwise_logits_path_bytes_total": {"engine", "rank", "mode"},
    "gatherwise_topp_rows_total": {"engine"},
    "gatherwise_topp_fallback_rows_total": {"engine"},
    "gatherwise_engine_up": {"engine"},
    "gatherwise_engine_heartbeat_age_seconds": {"engine"},
}
BUCKET_LABELS = {bucket_label(b) for b in range(NUM_BUCKETS)}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Sidecar first, then a 6 s TP=2 engine whose table runs gather for B <= 4, all_gather at 8 and sharded
    above (the mixed workload's batches are 1..64), so every mode and its operations show up; previously: both
    modes and all three collectives show up. Yields once the engine has exited and the sidecar caught up."""
    tmp = tmp_path_factory.mktemp("metrics")
    shm = tmp / "shm"
    (tmp / "table.yaml").write_text('table: {"1": gather, "2": gather, "4": gather, "8": all_gather, '
                                    '"16": sharded, "32": sharded, "64": sharded}\n')
    (tmp / "engine.yaml").write_text(f"engine:\n  initial_table_file: {tmp / 'table.yaml'}\n")
    (tmp / "sidecar.yaml").write_text("traces:\n  sample_ratio: 0.0\n  every_nth: 7\n")
    # An OTLP endpoint nobody listens on: exports fail in the background, ingestion must not notice.
    dead_otlp = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}"}
    sidecar, url = start_sidecar(str(shm), config=str(tmp / "sidecar.yaml"), env_extra=dead_otlp)
    engine = None
    try:
        engine = start_engine(str(shm), duration=6, config=str(tmp / "engine.yaml"))
        engine_id = engine.wait_line(r"gatherwise engine ([0-9a-f]{16}): tp=2", 120).group(1)
        ready = wait_for(lambda: httpx.get(f"{url}/readyz", timeout=5).status_code == 200, 60, "readyz 200")
        up_while_running = total(scrape(url), "gatherwise_engine_up", engine=engine_id)
        calls = int(engine.wait_line(r"(\d+) logits calls per rank", 120).group(1))
        assert engine.popen.wait(30) == 0, "".join(engine.output)

        def caught_up():
            info = httpx.get(f"{url}/v1/engine", timeout=5).json()
            return info if info["records_ingested"] + info["records_dropped"] >= 2 * calls \
                and info["calls_pending"] == 0 else None

        info = wait_for(caught_up, 30, "the sidecar to ingest every record")
        yield dict(url=url, engine_id=engine_id, calls=calls, info=info, ready=ready, up=up_while_running,
                   tmp=tmp, sidecar=sidecar)
    finally:
        if engine is not None and engine.popen.poll() is None:
            engine.stop()
        assert sidecar.stop() == 0, "".join(sidecar.output)


def test_every_family_with_its_labels(run: dict) -> None:
    got = samples(scrape(run["url"]))
    names = {n for n, _, _ in got}
    for family, labels in HISTOGRAMS.items():
        series = [lab for n, lab, _ in got if n == family + "_count"]
        assert series, f"{family} missing"
        assert all(set(lab) == labels for lab in series), (family, series[:3])
        assert all(lab["engine"] == run["engine_id"] and lab.get("bucket", "1") in BUCKET_LABELS for lab in series)
    for family, labels in SCALARS.items():
        assert family in names, f"{family} missing"
        assert all(set(lab) == labels for n, lab, _ in got if n == family)
    ops = {(lab["op"], lab["mode"]) for n, lab, _ in got if n == "gatherwise_collective_seconds_count"}
    first_ops = {("all_gather", "all_gather"), ("gather", "gather"), ("broadcast", "gather"),
                 ("shard_exchange", "sharded")}
    assert first_ops <= ops <= first_ops | {("shard_resolve", "sharded")}  # resolve: only temperature/top-p rows
    ranks = {lab["rank"] for n, lab, _ in got if n == "gatherwise_logits_path_seconds_count"}
    assert ranks == {"0", "1"}


def test_counts_match_the_calls_made(run: dict) -> None:
    text, calls, eng = scrape(run["url"]), run["calls"], run["engine_id"]
    assert run["info"]["records_dropped"] == 0 and run["info"]["calls_incomplete"] == 0
    assert run["info"]["calls_joined"] == calls
    for rank in ("0", "1"):
        assert total(text, "gatherwise_calls_total", engine=eng, rank=rank) == calls
        assert total(text, "gatherwise_logits_path_seconds_count", engine=eng, rank=rank) == calls
        assert total(text, "gatherwise_collective_bytes_total", rank=rank, op="broadcast") > 0
    gather_calls = total(text, "gatherwise_calls_total", engine=eng, rank="0", mode="gather")
    sharded_calls = total(text, "gatherwise_calls_total", engine=eng, rank="0", mode="sharded")
    assert 0 < gather_calls < calls and 0 < sharded_calls < calls
    other_calls = calls - gather_calls - sharded_calls  # all_gather
    # collectives are pooled over the two ranks
    assert total(text, "gatherwise_collective_seconds_count", op="broadcast") == 2 * gather_calls
    assert total(text, "gatherwise_collective_seconds_count", op="all_gather") == 2 * other_calls
    # a sharded call is its own op on every rank, never a gather
    assert total(text, "gatherwise_collective_seconds_count", op="shard_exchange") == 2 * sharded_calls
    assert total(text, "gatherwise_collective_seconds_count", op="gather") == 2 * gather_calls
    # only rank 0 samples in gather mode; every rank samples in all_gather and sharded mode
    assert total(text, "gatherwise_sample_seconds_count", mode="gather") == gather_calls
    assert total(text, "gatherwise_sample_seconds_count", mode="all_gather") == 2 * other_calls
    assert total(text, "gatherwise_sample_seconds_count", mode="sharded") == 2 * sharded_calls
    assert total(text, "gatherwise_step_critical_path_seconds_count", mode="sharded") == sharded_calls
    assert total(text, "gatherwise_step_critical_path_seconds_count", engine=eng) == calls
    assert total(text, "gatherwise_rank_skew_seconds_count", engine=eng) == calls
    assert run["up"] == 1
    assert total(text, "gatherwise_engine_up", engine=eng) == 0  # the engine closed its rings on exit


def test_openmetrics_has_exemplars_with_trace_ids(run: dict) -> None:
    response = httpx.get(f"{run['url']}/metrics", headers={"Accept": OPENMETRICS}, timeout=10)
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.rstrip().endswith("# EOF")
    exemplar_lines = [line for line in response.text.splitlines() if ' # {trace_id="' in line]
    assert exemplar_lines, "no exemplars although every 7th call is traced"
    classic = scrape(run["url"])
    assert "trace_id" not in classic and "# EOF" not in classic
    assert httpx.get(f"{run['url']}/v1/engine", timeout=5).json()["traces_started"] > 0


def test_promtool_accepts_the_exposition(run: dict) -> None:
    promtool = require_tool("promtool")
    result = subprocess.run([promtool, "check", "metrics"], input=scrape(run["url"]), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), \
        result.stdout + result.stderr


def test_prometheus_scrapes_per_rank_per_op_series(run: dict, tmp_path: Path) -> None:
    prometheus = require_tool("prometheus")
    target = run["url"].removeprefix("http://")
    config = tmp_path / "prometheus.yml"
    config.write_text("global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
                      f"scrape_configs:\n  - job_name: gatherwise\n    static_configs: [{{targets: ['{target}']}}]\n")
    port = free_port()
    proc = subprocess.Popen([prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--enable-feature=exemplar-storage"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    api = f"http://127.0.0.1:{port}/api/v1"
    try:
        def per_rank_op():
            body = httpx.get(f"{api}/query", params={
                "query": f'sum by (rank, op) (gatherwise_collective_bytes_total{{engine="{run["engine_id"]}"}})'},
                timeout=5).json()
            result = body["data"]["result"]
            return {(r["metric"]["rank"], r["metric"]["op"]): float(r["value"][1]) for r in result} or None

        series = wait_for(per_rank_op, 60, "Prometheus to scrape the sidecar")
        assert set(series) == {(r, op) for r in ("0", "1") for op, _ in bytes_series()}
        by_op = httpx.get(f"{api}/query", params={
            "query": "sum by (op, mode) (gatherwise_collective_seconds_count)"}, timeout=5).json()["data"]["result"]
        assert {(r["metric"]["op"], r["metric"]["mode"]) for r in by_op} >= {
            ("all_gather", "all_gather"), ("gather", "gather"), ("broadcast", "gather"), ("shard_exchange", "sharded")}
        calls = httpx.get(f"{api}/query", params={"query": "sum by (rank) (gatherwise_calls_total)"},
                          timeout=5).json()["data"]["result"]
        assert {r["metric"]["rank"]: float(r["value"][1]) for r in calls} == {"0": run["calls"], "1": run["calls"]}
        now = time.time()
        exemplars = httpx.get(f"{api}/query_exemplars", params={
            "query": "gatherwise_logits_path_seconds_bucket", "start": now - 600, "end": now + 60},
            timeout=5).json()["data"]
        assert any(len(e["labels"].get("trace_id", "")) == 32 for s in exemplars for e in s["exemplars"])
    finally:
        proc.terminate()
        proc.wait(30)
