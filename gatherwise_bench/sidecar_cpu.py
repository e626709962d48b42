"""The sidecar's own CPU, idle and at load: what it takes from the engine's cores.

    python -m gatherwise_bench.sidecar_cpu [--tp 2] [--rates 0,50,500,2000] [--seconds 10] [--out out/sidecar_cpu]

A real sidecar subprocess (`gatherwise sidecar`) follows a telemetry stand-in (gatherwise_bench.synthetic_engine: real
rings and a real control block, written from this process at a fixed call rate, cycling batch sizes 1..32). For each
rate and policy (manual, auto) it reads the sidecar's utime+stime from /proc/<pid>/stat over a window, while a
scraper GETs /metrics every 5 s as Prometheus would. Reported: % of one core, and CPU µs per call. Rate 0 is the
attached engine with no traffic (the floor: poll loops).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path

import httpx
import yaml

from gatherwise_bench.bench_sidecar import auth_header, start_sidecar
from gatherwise_bench.synthetic_engine import SyntheticEngine

SIZES = (1, 2, 4, 8, 16, 32)
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (every thread), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def scrape_every(url: str, period: float, stop: threading.Event) -> None:
    while not stop.wait(period):
        try:
            httpx.get(f"{url}/metrics", timeout=10)
        except httpx.HTTPError:
            pass


def measure(pid: int, engine: SyntheticEngine | None, rate: float, seconds: float) -> dict:
    c0, t0 = cpu_seconds(pid), time.monotonic()
    calls = engine.run(seconds, rate, SIZES) if engine is not None and rate > 0 else time.sleep(seconds) or 0
    c1, t1 = cpu_seconds(pid), time.monotonic()
    cpu = c1 - c0
    return {"rate": rate, "calls": calls, "wall_seconds": t1 - t0, "cpu_seconds": cpu,
            "core_percent": 100.0 * cpu / (t1 - t0), "cpu_us_per_call": 1e6 * cpu / calls if calls else None}


def run(tp: int, rates: list[float], seconds: float, workdir: str, poll: float) -> dict:
    shm = os.path.join(workdir, "shm")
    os.makedirs(shm)
    config = os.path.join(workdir, "gatherwise.yaml")
    Path(config).write_text(yaml.safe_dump({
        "engine": {"shm_dir": shm}, "sidecar": {"poll_interval_seconds": poll},
        "traces": {"enabled": True, "sample_ratio": 0.01},
        "policy": {"mode": "manual", "min_samples": 20, "window": 128, "probe_interval_seconds": 3.0,
                   "max_sample_age_seconds": 60.0}}))
    sidecar, url = start_sidecar(config)
    stop = threading.Event()
    scraper = threading.Thread(target=scrape_every, args=(url, 5.0, stop), daemon=True)
    scraper.start()
    rows = []
    engine = None
    try:
        time.sleep(2.0)
        rows.append({"phase": "no engine", **measure(sidecar.pid, None, 0, seconds)})
        engine = SyntheticEngine(shm, tp, capacity=1 << 17)
        engine.wait_attached(url, timeout_s=30)
        for policy in ("manual", "auto"):
            mode = "all_gather" if policy == "manual" else "auto"
            r = httpx.put(f"{url}/v1/mode", json={"mode": mode}, headers=auth_header(),
                          timeout=30)
            r.raise_for_status()
            engine.run(2.0, 200, SIZES)  # the command applies, the policy gets its first samples
            for rate in rates:
                rows.append({"phase": f"{policy}", **measure(sidecar.pid, engine, rate, seconds)})
    finally:
        stop.set()
        sidecar.terminate()
        sidecar.wait(30)
        if engine is not None:
            engine.close()
    return {"config": {"tp": tp, "rates": rates, "seconds": seconds, "sizes": SIZES, "poll_interval": poll,
                       "traces_sample_ratio": 0.01, "scrape_period_seconds": 5.0},
            "rows": rows, "load_average": os.getloadavg(), "cpus": os.cpu_count()}


def plot(path: Path, results: dict[str, dict]) -> None:
    """% of a core by call rate, one line per policy, for each result given (e.g. this build and a baseline)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (name, result) in enumerate(results.items()):
        for policy, style in (("manual", "-"), ("auto", "--")):
            rows = [r for r in result["rows"] if r["phase"] == policy]
            ax.plot([r["rate"] for r in rows], [r["core_percent"] for r in rows], style, marker="o", color=f"C{i}",
                    label=f"{name} {policy}")
    ax.set_xscale("symlog", linthresh=50)
    tp = next(iter(results.values()))["config"]["tp"]
    ax.set_xlabel(f"engine calls per second (TP={tp})")
    ax.set_ylabel("sidecar CPU, % of one core")
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gatherwise_bench.sidecar_cpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--rates", default="0,50,500,2000", help="calls per second, comma separated")
    p.add_argument("--seconds", type=float, default=10.0, help="measurement window per rate")
    p.add_argument("--poll", type=float, default=0.02, help="sidecar.poll_interval_seconds")
    p.add_argument("--out", default="out/sidecar_cpu")
    p.add_argument("--baseline", help="a sidecar_cpu.json of another build to draw next to this one")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gw-sidecar-cpu-") as tmp:
        result = run(args.tp, [float(x) for x in args.rates.split(",")], args.seconds, tmp, args.poll)
    (out / "sidecar_cpu.json").write_text(json.dumps(result, indent=2))
    curves = {"this build": result}
    if args.baseline:
        curves["baseline"] = json.loads(Path(args.baseline).read_text())
    plot(out / "sidecar_cpu.png", curves)
    print(f"{'phase':<10} {'rate/s':>7} {'calls':>7} {'% core':>7} {'µs/call':>8}")
    for row in result["rows"]:
        per = f"{row['cpu_us_per_call']:.0f}" if row["cpu_us_per_call"] else "-"
        print(f"{row['phase']:<10} {row['rate']:>7.0f} {row['calls']:>7} {row['core_percent']:>7.2f} {per:>8}")
    print(f"load average {result['load_average']}; wrote {out / 'sidecar_cpu.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
