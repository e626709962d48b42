"""The sidecar's own CPU, idle and at load: what it takes from the engine's cores.

    python -m lab.sidecar_cpu [--tp 2] [--rates 0,100] [--seconds 30] [--baseline-rev main]
                                          [--out out/sidecar_cpu]

A real sidecar subprocess (`gatherwise sidecar`) first runs with no engine (idle), then follows a telemetry
stand-in (lab.standins.telemetry: real rings and a real control block, written from this process at a
fixed call rate, cycling batch sizes 1..32). For each rate and policy (manual, auto) it reads the sidecar's CPU
time from the OS over a window: utime+stime from /proc/<pid>/stat (clock ticks, every thread, ended ones too) and
the sum of /proc/<pid>/task/*/schedstat (nanoseconds, live threads), while a scraper GETs /metrics every 5 s as
Prometheus would. Reported: % of one core, and CPU µs per call. Rate 0 is the attached engine with no traffic.
--baseline-rev runs the same phases, in the same run, against a sidecar built from that git revision (extracted
with `git archive`), so two builds are compared under the same machine load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx
import yaml

from gatherwise.bench.bench_sidecar import auth_header, start_sidecar
from lab.standins.telemetry import TelemetryStandIn

ROOT = Path(__file__).resolve().parents[1]
SIZES = (1, 2, 4, 8, 16, 32)
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (every thread), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def schedstat_seconds(pid: int) -> float:
    """On-CPU time of the process's live threads, from /proc/<pid>/task/*/schedstat (ns resolution)."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            pass
    return total * 1e-9


def thread_activity(pid: int) -> dict[str, tuple[int, float]]:
    """Per thread: (context switches, on-CPU seconds) so far — who wakes, how often, at what cost. Python does not
    name its native threads, so they are told apart by id: "main" (asyncio: uvicorn) and "tid N"."""
    out: dict[str, tuple[int, float]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = "main" if task.name == str(pid) else f"tid {task.name}"
            status = (task / "status").read_text()
            ran = int((task / "schedstat").read_text().split()[0]) * 1e-9
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            continue
        switches = sum(int(line.split()[1]) for line in status.splitlines() if line.endswith("ctxt_switches")
                       or "ctxt_switches:" in line)
        n, t = out.get(name, (0, 0.0))
        out[name] = (n + switches, t + ran)
    return out


def scrape_every(url: str, period: float, stop: threading.Event) -> None:
    while not stop.wait(period):
        try:
            httpx.get(f"{url}/metrics", timeout=10)
        except httpx.HTTPError:
            pass


def measure(pid: int, engine: TelemetryStandIn | None, rate: float, seconds: float) -> dict:
    a0, c0, r0, t0 = thread_activity(pid), cpu_seconds(pid), schedstat_seconds(pid), time.monotonic()
    if engine is not None and rate > 0:
        calls = engine.run(seconds, rate, SIZES)
    else:
        time.sleep(seconds)
        calls = 0
    a1, c1, r1, t1 = thread_activity(pid), cpu_seconds(pid), schedstat_seconds(pid), time.monotonic()
    cpu, ran, wall = c1 - c0, r1 - r0, t1 - t0
    threads = {name: {"wakeups_per_second": (n - a0.get(name, (0, 0.0))[0]) / wall,
                      "core_percent": 100.0 * (t - a0.get(name, (0, 0.0))[1]) / wall} for name, (n, t) in a1.items()}
    return {"rate": rate, "calls": calls, "wall_seconds": wall, "cpu_seconds": cpu, "run_seconds": ran,
            "core_percent": 100.0 * cpu / wall, "run_core_percent": 100.0 * ran / wall,
            "cpu_us_per_call": 1e6 * ran / calls if calls else None, "threads": threads}


def extract(rev: str, into: str) -> str:
    """The source tree of git revision `rev` of this checkout, extracted under `into`."""
    os.makedirs(into)
    archive = subprocess.run(["git", "archive", rev], check=True, capture_output=True, cwd=ROOT).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return into


def run(tp: int, rates: list[float], seconds: float, workdir: str, poll: float, source: str | None = None) -> dict:
    shm = os.path.join(workdir, "shm")
    os.makedirs(shm)
    config = os.path.join(workdir, "gatherwise.yaml")
    Path(config).write_text(yaml.safe_dump({
        "engine": {"shm_dir": shm}, "sidecar": {"poll_interval_seconds": poll},
        "traces": {"enabled": True, "sample_ratio": 0.01},
        "policy": {"mode": "manual", "min_samples": 20, "window": 128, "probe_interval_seconds": 3.0,
                   "max_sample_age_seconds": 60.0}}))
    sidecar, url = start_sidecar(config, source)
    stop = threading.Event()
    scraper = threading.Thread(target=scrape_every, args=(url, 5.0, stop), daemon=True)
    scraper.start()
    rows = []
    engine = None
    try:
        httpx.get(f"{url}/metrics", timeout=30)  # the first scrape builds what later ones reuse: not idle cost
        time.sleep(2.0)
        rows.append({"phase": "no engine", **measure(sidecar.pid, None, 0, seconds)})
        engine = TelemetryStandIn(shm, tp, capacity=1 << 17)
        engine.wait_attached(url, timeout_s=30)
        # auto first: its probe budget is a share of every call seen, so after a long manual phase it spends the
        # saved-up budget in back-to-back probes (a burst that ends) instead of its steady state
        for policy in ("auto", "manual"):
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
            "rows": rows, "load_average": os.getloadavg(), "cpus": os.cpu_count(), "source": source or "this build"}


def plot(path: Path, results: dict[str, dict]) -> None:
    """% of a core by call rate, one line per policy, for each result given (e.g. this build and a baseline)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (name, result) in enumerate(results.items()):
        for policy, style in (("auto", "--"), ("manual", "-")):
            rows = [r for r in result["rows"] if r["phase"] == policy]
            ax.plot([r["rate"] for r in rows], [r["run_core_percent"] for r in rows], style, marker="o",
                    color=f"C{i}", label=f"{name} {policy}")
        idle = [r for r in result["rows"] if r["phase"] == "no engine"]
        ax.plot([0] * len(idle), [r["run_core_percent"] for r in idle], "x", color=f"C{i}", label=f"{name} no engine")
    ax.set_xscale("symlog", linthresh=50)
    tp = next(iter(results.values()))["config"]["tp"]
    ax.set_xlabel(f"engine calls per second (TP={tp})")
    ax.set_ylabel("sidecar CPU, % of one core")
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.sidecar_cpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--rates", default="0,100", help="calls per second, comma separated")
    p.add_argument("--seconds", type=float, default=30.0, help="measurement window per rate")
    p.add_argument("--poll", type=float, default=0.02, help="sidecar.poll_interval_seconds")
    p.add_argument("--out", default="out/sidecar_cpu")
    p.add_argument("--baseline-rev", help="also measure a sidecar built from this git revision, in the same run")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rates = [float(x) for x in args.rates.split(",")]
    curves: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="gw-sidecar-cpu-") as tmp:
        if args.baseline_rev:
            source = extract(args.baseline_rev, os.path.join(tmp, "baseline"))
            curves[args.baseline_rev] = run(args.tp, rates, args.seconds, os.path.join(tmp, "b"), args.poll, source)
        curves["this build"] = run(args.tp, rates, args.seconds, os.path.join(tmp, "t"), args.poll)
    result = {"builds": curves, "uptime": os.getloadavg()}
    (out / "sidecar_cpu.json").write_text(json.dumps(result, indent=2))
    plot(out / "sidecar_cpu.png", curves)
    print(f"{'build':<12} {'phase':<10} {'rate/s':>7} {'calls':>7} {'% core':>7} {'(ticks)':>8} {'µs/call':>8}")
    for name, build in curves.items():
        for row in build["rows"]:
            per = f"{row['cpu_us_per_call']:.0f}" if row["cpu_us_per_call"] else "-"
            print(f"{name:<12} {row['phase']:<10} {row['rate']:>7.0f} {row['calls']:>7} "
                  f"{row['run_core_percent']:>7.3f} {row['core_percent']:>8.2f} {per:>8}")
            busy = sorted(row["threads"].items(), key=lambda kv: -kv[1]["core_percent"])[:4]
            print(" " * 20 + "  ".join(f"{n}: {v['wakeups_per_second']:.0f}/s {v['core_percent']:.3f}%"
                                      for n, v in busy))
    print(f"load average {os.getloadavg()} on {os.cpu_count()} cpus; wrote {out / 'sidecar_cpu.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
