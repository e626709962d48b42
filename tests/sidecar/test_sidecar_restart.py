"""Sidecar SIGKILLed and restarted while a real TP=2 engine runs: the engine keeps completing calls, the
restarted sidecar's counters continue from the ring headers, and nothing hangs."""

from __future__ import annotations

import functools
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from gatherwise.shm_format.ring import engine_dir, engine_dir_name, ring_path
from gatherwise.sidecar.ingest.ring_reader import RingReader
from gatherwise.sidecar.metrics.header_counters import total_calls
from tests._sidecar import samples, scrape, start_engine, start_sidecar, total, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def header_calls(shm: Path, engine_id: int) -> list[int]:
    out = []
    for rank in (0, 1):
        with RingReader(ring_path(shm, engine_id, rank)) as reader:
            out.append(total_calls(reader.header()))
    return out


def ready(url: str) -> bool:
    return httpx.get(f"{url}/readyz", timeout=5).status_code == 200


def test_sidecar_killed_and_restarted_while_the_engine_runs(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    engine = start_engine(str(shm), duration=120, workload="fixed:2")
    sidecars = []
    try:
        engine_id = int(engine.wait_line(r"gatherwise engine ([0-9a-f]{16}): tp=2", 120).group(1), 16)
        label = engine_dir_name(engine_id)
        first, url = start_sidecar(str(shm))
        sidecars.append(first)
        wait_for(lambda: ready(url), 60, "first sidecar ready")
        before = [total(scrape(url), "gatherwise_calls_total", engine=label, rank=r) for r in ("0", "1")]
        assert min(before) > 0

        first.popen.send_signal(signal.SIGKILL)
        assert first.popen.wait(10) == -signal.SIGKILL
        at_kill = header_calls(shm, engine_id)
        # the engine never waits for the sidecar: its header call counters keep moving while none runs
        wait_for(lambda: min(header_calls(shm, engine_id)) > max(at_kill) + 10, 60, "engine calls without sidecar")

        second, url = start_sidecar(str(shm))
        sidecars.append(second)
        wait_for(lambda: ready(url), 60, "restarted sidecar ready")
        info = httpx.get(f"{url}/v1/engine", timeout=5).json()
        assert info["engine_id"] == label
        after = [total(scrape(url), "gatherwise_calls_total", engine=label, rank=r) for r in ("0", "1")]
        assert all(a >= b for a, b in zip(after, before, strict=True)), (before, after)
        assert all(a >= k for a, k in zip(after, at_kill, strict=True)), (at_kill, after)  # header values

        assert engine.stop(signal.SIGTERM, timeout=60) == 0, "".join(engine.output)
        calls = int(engine.wait_line(r"(\d+) logits calls per rank", 10).group(1))
        assert not os.path.exists(engine_dir(shm, engine_id)), "engine left its shm files behind"
        final = wait_for(lambda: [total(scrape(url), "gatherwise_calls_total", engine=label, rank=r)
                                  for r in ("0", "1")] == [calls, calls] or None, 30, "final counts")
        assert final
        assert second.stop() == 0, "".join(second.output)
    finally:
        for proc in [engine, *sidecars]:
            if proc.popen.poll() is None:
                proc.popen.kill()
                proc.popen.wait(10)


def test_sidecar_without_engine_is_alive_but_not_ready(tmp_path: Path) -> None:
    sidecar, url = start_sidecar(str(tmp_path / "empty"))
    try:
        assert httpx.get(f"{url}/healthz", timeout=5).json() == {"status": "ok"}
        response = httpx.get(f"{url}/readyz", timeout=5)
        assert response.status_code == 503 and "no engine" in response.json()["reason"]
        assert httpx.get(f"{url}/v1/engine", timeout=5).json()["attached"] is False
        assert httpx.get(f"{url}/docs", timeout=5).status_code == 200
        paths = httpx.get(f"{url}/openapi.json", timeout=5).json()["paths"]
        assert {"/metrics", "/healthz", "/readyz", "/v1/engine"} <= set(paths)
        assert httpx.get(f"{url}/metrics", timeout=5, follow_redirects=False).status_code == 200
        start = time.monotonic()
        assert sidecar.stop(signal.SIGINT) == 0
        assert time.monotonic() - start < 20
    finally:
        if sidecar.popen.poll() is None:
            sidecar.popen.kill()


def exposition_with_calls(url: str, calls: int) -> str | None:
    text = scrape(url)
    return text if total(text, "gatherwise_calls_total", rank="0") == calls else None


def test_engine_restart_under_a_running_sidecar_switches_without_mixing(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    sidecar, url = start_sidecar(str(shm))
    try:
        labels = []
        for _ in range(2):
            engine = start_engine(str(shm), duration=2, workload="fixed:1")
            labels.append(engine.wait_line(r"gatherwise engine ([0-9a-f]{16}): tp=2", 120).group(1))
            calls = int(engine.wait_line(r"(\d+) logits calls per rank", 120).group(1))
            assert engine.popen.wait(30) == 0
            wait_for(lambda: httpx.get(f"{url}/v1/engine", timeout=5).json()["engine_id"] == labels[-1], 30,
                     "the sidecar to follow the newest engine")
            text = wait_for(functools.partial(exposition_with_calls, url, calls), 30, "the new engine's counts")
            engines = {lab["engine"] for _, lab, _ in samples(text) if "engine" in lab}
            assert engines == {labels[-1]}, engines  # the previous instance's series are gone
        assert labels[0] != labels[1]
        assert httpx.get(f"{url}/v1/engine", timeout=5).json()["engines_seen"] == 2
    finally:
        assert sidecar.stop() == 0, "".join(sidecar.output)
