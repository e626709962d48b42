"""/metrics latency of a real sidecar, idle against while PUT /v1/mode?wait=600 requests wait, JSON + PNG.

    .venv/bin/python -m lab.api_latency [--waiting 50] [--rounds 6] [--scrapes 200] [--out out/api]

A real `gatherwise sidecar` (uvicorn, 127.0.0.1) attached to a stand-in engine (rings, liveness lock and control
block written by the engine side's own code: lab.standins.engine) whose rank 0 applies a command only
when the benchmark says so. Each round scrapes /metrics `--scrapes` times idle, then sends `--waiting` PUTs with
wait=600 and, once every one of them has written its command and waits, scrapes again; then rank 0 applies the
newest command and every PUT must answer 200 (applied) before the next round. Rounds interleave the two variants,
so drift of the host's load hits both alike. A waiting PUT costs the sidecar one control-block read per 10 ms
(shared by all of them) and nothing on its event loop: the two distributions should match within noise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from gatherwise.bench.bench_sidecar import auth_header, start_sidecar
from gatherwise.bench.figures import pyplot, save
from gatherwise.bench.host_cpu import cpu_description
from lab.standins.engine import StandinEngine

MODES = ("gather", "all_gather")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def scrape_times(url: str, n: int) -> list[float]:
    """Seconds per GET /metrics, one after another on one kept-alive connection, as Prometheus scrapes."""
    times = []
    scraper = httpx.Client(base_url=url, timeout=60)
    for _ in range(n):
        t0 = time.perf_counter()
        response = scraper.get("/metrics")
        times.append(time.perf_counter() - t0)
        response.raise_for_status()
    return times


class WaitingPuts:
    """`count` PUT /v1/mode?wait=600 sent at once from an event loop of their own thread."""

    def __init__(self, url: str, count: int, round_index: int) -> None:
        self.url, self.count, self.round = url, count, round_index
        self.statuses: list[int] = []
        self.thread = threading.Thread(target=lambda: asyncio.run(self._send()), daemon=True)
        self.thread.start()

    async def _send(self) -> None:
        limits = httpx.Limits(max_connections=self.count + 1)
        async with httpx.AsyncClient(base_url=self.url, headers=auth_header(), timeout=700, limits=limits) as client:
            async def one(i: int) -> int:
                body = {"mode": MODES[(self.round + i) % 2], "buckets": [1 << (i % 16)]}
                return (await client.put("/v1/mode", params={"wait": 600}, json=body)).status_code
            self.statuses = list(await asyncio.gather(*(one(i) for i in range(self.count))))

    def join(self, timeout: float) -> list[int]:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise RuntimeError(f"the waiting PUTs did not all answer within {timeout} s of the switch")
        return self.statuses


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.01)
    raise RuntimeError(f"timed out after {timeout} s waiting for {what}")


def measure(waiting: int, rounds: int, scrapes: int) -> dict[str, Any]:
    shm = tempfile.mkdtemp(prefix="gatherwise-api-latency-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    os.chmod(shm, 0o700)
    work = tempfile.mkdtemp(prefix="gatherwise-api-latency-")
    engine = StandinEngine(shm)
    config = Path(work) / "gatherwise.yaml"
    config.write_text(yaml.safe_dump({"engine": {"shm_dir": shm}, "traces": {"enabled": False},
                                      "policy": {"mode": "auto", "probe_budget": 0.0}}))
    proc, url = start_sidecar(str(config))
    idle: list[list[float]] = []
    loaded: list[list[float]] = []
    try:
        api = httpx.Client(base_url=url, timeout=60, headers=auth_header())
        wait_for(lambda: _get(api, "/v1/mode") == 200, 60, "the sidecar to attach the stand-in engine")
        scrape_times(url, 20)  # warm-up, not counted
        for r in range(rounds):
            idle.append(scrape_times(url, scrapes))
            seq_before = api.get("/v1/mode").json()["requested_seq"]
            puts = WaitingPuts(url, waiting, r)
            wait_for(lambda s=seq_before: api.get("/v1/mode").json()["requested_seq"] >= s + waiting, 60,
                     f"{waiting} PUTs to write their commands")  # each waits from the moment it wrote
            loaded.append(scrape_times(url, scrapes))
            engine.apply()
            statuses = puts.join(60)
            if statuses != [200] * waiting:
                raise RuntimeError(f"not every waiting PUT answered 200 once applied: {sorted(set(statuses))}")
    finally:
        proc.terminate()
        proc.wait(30)
        engine.close()
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    return summarize(idle, loaded, waiting, scrapes)


def _get(api: httpx.Client, path: str) -> int:
    try:
        return api.get(path).status_code
    except httpx.HTTPError:
        return 0


def summarize(idle: list[list[float]], loaded: list[list[float]], waiting: int, scrapes: int) -> dict[str, Any]:
    def stats(rounds: list[list[float]]) -> dict[str, Any]:
        pooled = [t for r in rounds for t in r]
        return {"p50_ms": 1e3 * statistics.median(pooled), "p99_ms": 1e3 * percentile(pooled, 0.99),
                "round_p50_ms": [1e3 * statistics.median(r) for r in rounds],
                "round_p99_ms": [1e3 * percentile(r, 0.99) for r in rounds], "samples_ms": [1e3 * t for t in pooled]}

    a, b = stats(idle), stats(loaded)
    return {"waiting_puts": waiting, "rounds": len(idle), "scrapes_per_round": scrapes,
            "machine": {"cpu": cpu_description(), "cores": os.cpu_count(), "python": platform.python_version(),
                        "load_average_1m": os.getloadavg()[0]},
            "idle": a, "waiting": b,
            "ratio_p50": b["p50_ms"] / a["p50_ms"], "ratio_p99": b["p99_ms"] / a["p99_ms"]}


def plot(result: dict[str, Any], path: Path) -> Path:
    plt = pyplot()
    fig, (dist, rounds) = plt.subplots(1, 2, figsize=(11, 4))
    labels = ["idle", f"{result['waiting_puts']} PUTs waiting"]
    dist.boxplot([result["idle"]["samples_ms"], result["waiting"]["samples_ms"]], showfliers=True)
    dist.set_xticks([1, 2], labels)
    dist.set_ylabel("GET /metrics, ms")
    dist.set_yscale("log")
    dist.set_title(f"p50 {result['idle']['p50_ms']:.2f} vs {result['waiting']['p50_ms']:.2f} ms, "
                   f"p99 {result['idle']['p99_ms']:.2f} vs {result['waiting']['p99_ms']:.2f} ms")
    x = range(1, result["rounds"] + 1)
    for key, label in zip(("idle", "waiting"), labels, strict=True):
        rounds.plot(x, result[key]["round_p50_ms"], marker="o", label=f"{label} p50")
        rounds.plot(x, result[key]["round_p99_ms"], marker="x", linestyle="--", label=f"{label} p99")
    rounds.set_xlabel("round (variants interleaved)")
    rounds.set_ylabel("ms")
    rounds.legend(fontsize=8)
    return save(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--waiting", type=int, default=50, help="PUT /v1/mode?wait=600 waiting at once")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--scrapes", type=int, default=200, help="GET /metrics per variant and round")
    parser.add_argument("--out", default="out/api_latency", help="folder for api_latency.json and .png")
    args = parser.parse_args(argv)
    result = measure(args.waiting, args.rounds, args.scrapes)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "api_latency.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out / "api_latency.png")
    print(json.dumps({k: v for k, v in result.items() if k not in ("idle", "waiting")}
                     | {v: {k: result[v][k] for k in ("p50_ms", "p99_ms")} for v in ("idle", "waiting")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
