"""The live page's server side, in process (TestClient): its assets and their Content-Security-Policy, GET /v1/live
against a real TP=2 engine, its bounds, the history's quantiles and the rank info files it shows."""

from __future__ import annotations

import os
import re
import socket

import pytest

from gatherwise.config import load_config
from gatherwise.shm_format.engine_info import (
    MAX_INFO_BYTES,
    MAX_TEXT_CHARS,
    RankInfo,
    info_path,
    read_rank_info,
    write_rank_info,
)
from gatherwise.sidecar.api.app import create_app
from gatherwise.sidecar.api.routes_page import ASSETS, CSP, asset
from gatherwise.sidecar.ingest.live_history import quantile
from gatherwise.sidecar.state import build_state
from tests._control_engine import BackgroundEngine, LoopSpec
from tests._sidecar import wait_for
from tests.sidecar.control.test_control_flip import write_config


@pytest.fixture
def client(shm_dir, tmp_path):
    from fastapi.testclient import TestClient

    with TestClient(create_app(build_state(load_config(write_config(tmp_path, shm_dir))))) as c:
        yield c


def test_the_page_and_its_assets_allow_nothing_but_this_origin(client):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == CSP
    assert "default-src 'none'" in CSP and "script-src 'self'" in CSP and "connect-src 'self'" in CSP
    for name, media_type in ASSETS.items():
        r = client.get(f"/page/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith(media_type), name
        assert r.headers["content-security-policy"] == CSP and r.headers["x-content-type-options"] == "nosniff"
    assert client.get("/page/index.html").status_code == 404  # only the listed assets
    assert client.get("/page/..%2Fpage.py").status_code == 404


def test_the_page_has_no_inline_script_no_markup_from_data_and_no_other_host():
    html = asset("index.html").decode()
    assert re.findall(r"<script[^>]*>", html) == ['<script src="/page/page.js" defer>']
    assert not re.search(r"\son[a-z]+=|\sstyle=|javascript:", html)
    js = asset("page.js").decode()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in js, sink
    for text in (html, js, asset("page.css").decode()):
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", text)  # the SVG namespace is a name, not a host


def test_live_without_an_engine_and_its_bounds(client):
    body = client.get("/v1/live").json()
    assert body["engine"] is None and body["history"] == [] and "no engine" in body["mode_error"]
    for points in (0, 601, "x"):
        assert client.get("/v1/live", params={"points": points}).status_code == 422


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_live_shows_the_engine_its_counters_and_the_path_over_time(client, shm_dir, tmp_path):
    engine = BackgroundEngine(LoopSpec(write_config(tmp_path, shm_dir), str(tmp_path / "stop")))
    try:
        wait_for(lambda: client.get("/v1/mode").status_code == 200, 90, "the engine to attach")
        live = wait_for(lambda: (b := client.get("/v1/live", params={"points": 3}).json())["history"]
                        and len(b["history"]) == 3 and b["history"][-1]["paths"] and b, 60, "three history points")
    finally:
        engine.stop()
    eng = live["engine"]
    assert eng["kind"] == "gatherwise reference engine" and eng["tp_size"] == 2 and eng["up"]
    assert [r["rank"] for r in eng["ranks"]] == [0, 1] and {r["node"] for r in eng["ranks"]} == {socket.gethostname()}
    assert set(eng["ranks"][0]["sampler"]) == {"all_gather", "gather", "sharded"}
    assert eng["ranks"][0]["route"] == {"runner": "", "route": "", "fingerprint": ""}  # the reference engine's
    assert live["mode"]["active"]["1"] == "all_gather" and live["mode_error"] is None
    assert live["calls"]["all_gather"] > 0 and set(live["dropped"]) >= {"overwritten", "torn", "invalid"}
    costs = live["op_seconds_per_call"]["all_gather"]
    assert costs["logits_path"] >= costs["all_gather"] > 0
    times = [p["time"] for p in live["history"]]
    assert times == sorted(times)
    for point in live["history"][1:]:
        for path in point["paths"]:
            assert path["mode"] == "all_gather" and path["calls"] > 0
            assert 0 < path["p50_seconds"] <= path["p99_seconds"]
        assert point["path_share"] is None or 0.0 <= point["path_share"] <= 1.0


def test_quantile_interpolates_inside_the_bucket():
    bounds = [1.0, 2.0, 4.0]
    assert quantile(0.5, bounds, [0, 0, 0, 0]) is None
    assert quantile(0.5, bounds, [0, 2, 0, 0]) == 1.5  # the median of two calls in (1, 2]
    assert quantile(0.25, bounds, [2, 2, 0, 0]) == 0.5
    assert quantile(0.99, bounds, [0, 0, 0, 5]) == 4.0  # above every bound: the top bound


def test_rank_info_round_trip_and_what_the_reader_refuses(tmp_path):
    text = "x" * (MAX_TEXT_CHARS + 50)
    written = write_rank_info(tmp_path, 1, text, "1.2", {"gather": "<b>rank 0</b>"})
    assert oct(os.stat(info_path(tmp_path, 1)).st_mode & 0o777) == "0o600"
    assert read_rank_info(tmp_path, 1) == written and len(written.kind) == MAX_TEXT_CHARS
    assert written.node == socket.gethostname()[:MAX_TEXT_CHARS] and written.pid == os.getpid()
    assert read_rank_info(tmp_path, 0) is None  # none written
    good = RankInfo("k", "v", 0, "n", 1).to_json()
    for bad in (b"{", b"[]", good.replace(b'"format":1', b'"format":2'), good.replace(b'"rank":0', b'"rank":-1'),
                good.replace(b'"kind":"k"', b'"kind":7'), good.replace(b'"sampler":{}', b'"sampler":{"a":1}'),
                good + b" " * MAX_INFO_BYTES):
        with open(info_path(tmp_path, 0), "wb") as f:
            f.write(bad)
        assert read_rank_info(tmp_path, 0) is None, bad[:60]
    os.remove(info_path(tmp_path, 0))
    os.symlink(info_path(tmp_path, 1), info_path(tmp_path, 0))
    assert read_rank_info(tmp_path, 0) is None  # a link is never followed


def test_adapters_name_their_engine_version_and_sampler():
    from gatherwise.engine_hooks.adapters.rank_hooks import RankHooks
    from gatherwise.engine_hooks.adapters.sampler_rows import sampler_labels
    from gatherwise.engine_hooks.adapters.sglang.step import SglangStepHooks
    from gatherwise.engine_hooks.adapters.vllm.worker import VllmWorker
    from gatherwise.shm_format.hooks_off import ENGINES

    assert (VllmWorker.ENGINE, SglangStepHooks.ENGINE) == ENGINES  # spelled as their hooks-off notices
    modes = {"all_gather", "gather", "sharded"}
    assert set(sampler_labels("vLLM", False)) == set(sampler_labels("vLLM", True)) == modes

    class Pytest(RankHooks):
        DISTRIBUTION = "pytest"

    class Missing(RankHooks):
        DISTRIBUTION = "no-such-distribution-here"

    assert Pytest.engine_version(Pytest.__new__(Pytest)) == pytest.__version__
    assert Missing.engine_version(Missing.__new__(Missing)) == "unknown"
