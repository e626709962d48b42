"""/metrics at TP=8 with every mode and every bucket: how many series, and how long a scrape takes.

    python -m lab.metrics_cardinality [--tp 8] [--calls-per-cell 24] [--scrapes 30] [--out out/cardinality]

A real sidecar subprocess follows a telemetry stand-in (lab.standins.telemetry: 8 real rings and a real
control block) that runs calls of every mode code the engine has (all_gather, gather, sharded; sharded calls alternate
one and two collectives, some with top-p fallbacks) in all 16 batch-size buckets: the worst case, every label
combination present. The policy is auto, so its estimate gauges exist for every (bucket, mode) it chooses among.
Then --scrapes GETs of /metrics in the classic text format and in OpenMetrics (what Prometheus asks for with
exemplar storage on): series (sample lines) per family, body size and wall time per scrape (median, p90).
Targets: at most 5 000 series per engine, a scrape in at most 50 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from gatherwise.bench.bench_sidecar import start_sidecar
from gatherwise.bench.figures import pyplot, save
from gatherwise.modes import IMPLEMENTED, NUM_BUCKETS, Mode, bucket_upper_bound
from lab.standins.telemetry import TelemetryStandIn

OPENMETRICS = "application/openmetrics-text; version=1.0.0"
PAUSE_EVERY = 4  # rounds of calls between two pauses of the stand-in engine
PAUSE_S = 0.05
ATTACH_TIMEOUT_S = 60
MAX_SERIES, MAX_SCRAPE_SECONDS = 5000, 0.050


def family_of(line: str) -> str:
    name = line.split("{", 1)[0].split(" ", 1)[0]
    for suffix in ("_bucket", "_count", "_sum"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def scrape_stats(url: str, accept: str | None, scrapes: int) -> dict:
    headers = {"Accept": accept} if accept else {}
    times, body = [], ""
    with httpx.Client(timeout=30) as client:
        client.get(f"{url}/metrics", headers=headers)  # warm: first-use costs are not a scrape's
        for _ in range(scrapes):
            t0 = time.perf_counter()
            r = client.get(f"{url}/metrics", headers=headers)
            times.append(time.perf_counter() - t0)
            body = r.text
    lines = [ln for ln in body.splitlines() if ln and not ln.startswith("#")]
    per_family = Counter(family_of(ln) for ln in lines)
    ordered = sorted(times)
    return {"series": len(lines), "bytes": len(body.encode()), "median_seconds": statistics.median(times),
            "p90_seconds": ordered[int(0.9 * (len(ordered) - 1))], "max_seconds": ordered[-1],
            "per_family": dict(sorted(per_family.items(), key=lambda kv: -kv[1]))}


def run(tp: int, calls_per_cell: int, scrapes: int, workdir: str) -> dict:
    import yaml

    shm = os.path.join(workdir, "shm")
    os.makedirs(shm)
    config = os.path.join(workdir, "gatherwise.yaml")
    Path(config).write_text(yaml.safe_dump({
        "engine": {"shm_dir": shm}, "traces": {"enabled": True, "sample_ratio": 0.05},
        "policy": {"mode": "auto", "probe_budget": 0.0, "min_samples": 1000}}))
    sidecar, url = start_sidecar(config)
    engine = TelemetryStandIn(shm, tp, capacity=1 << 16)
    try:
        engine.wait_attached(url, ATTACH_TIMEOUT_S)
        modes = [0, 1, 2]  # every mode code the ring format has, implemented in this checkout or not
        for i in range(calls_per_cell):
            for b in range(NUM_BUCKETS):
                for m in modes:
                    engine.call(bucket_upper_bound(b), mode=m)
            if i % PAUSE_EVERY == PAUSE_EVERY - 1:
                time.sleep(PAUSE_S)  # let the sidecar keep up: the bench measures a scrape, not a flood
        want = engine.call_index * tp
        deadline = time.monotonic() + 60
        while True:
            info = httpx.get(f"{url}/v1/engine", timeout=5).json()
            if info["records_ingested"] + info["records_dropped"] >= want and info["calls_pending"] == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"sidecar did not catch up: {info}")
            time.sleep(0.2)
        text = scrape_stats(url, None, scrapes)
        openmetrics = scrape_stats(url, OPENMETRICS, scrapes)
    finally:
        sidecar.terminate()
        sidecar.wait(30)
        engine.close()
    return {"config": {"tp": tp, "buckets": NUM_BUCKETS, "mode_codes": modes, "calls_per_cell": calls_per_cell,
                       "implemented_modes": [m.label for m in IMPLEMENTED], "scrapes": scrapes,
                       "all_modes": [m.label for m in Mode]},
            "calls": engine.call_index, "text": text, "openmetrics": openmetrics,
            "targets": {"max_series": MAX_SERIES, "max_scrape_seconds": MAX_SCRAPE_SECONDS},
            "load_average": os.getloadavg(), "cpus": os.cpu_count()}


def plot(path: Path, result: dict) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    families = result["text"]["per_family"]
    left.barh(list(families)[::-1], list(families.values())[::-1])
    left.axvline(MAX_SERIES, color="grey", ls="--", lw=1)
    left.set_xlabel(f"series (total {result['text']['series']}, target <= {MAX_SERIES})")
    left.tick_params(axis="y", labelsize=7)
    fmts = ("text", "openmetrics")
    for i, stat in enumerate(("median", "p90")):
        right.bar([x + 0.35 * i for x in range(2)], [result[f][f"{stat}_seconds"] * 1e3 for f in fmts], 0.35,
                  label=stat)
    right.set_xticks([0.175, 1.175], fmts)
    right.axhline(MAX_SCRAPE_SECONDS * 1e3, color="grey", ls="--", lw=1, label="target")
    right.set_ylabel("GET /metrics (ms)")
    right.legend()
    fig.suptitle(f"/metrics at TP={result['config']['tp']}, mode codes {result['config']['mode_codes']}, "
                 "every bucket")
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.metrics_cardinality",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--tp", type=int, default=8)
    p.add_argument("--calls-per-cell", type=int, default=24, help="calls per (bucket, mode)")
    p.add_argument("--scrapes", type=int, default=30)
    p.add_argument("--out", default="out/cardinality")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gw-cardinality-") as tmp:
        result = run(args.tp, args.calls_per_cell, args.scrapes, tmp)
    (out / "cardinality.json").write_text(json.dumps(result, indent=2))
    for fmt in ("text", "openmetrics"):
        r = result[fmt]
        ms = {k: r[f"{k}_seconds"] * 1e3 for k in ("median", "p90", "max")}
        print(f"{fmt:<12} series {r['series']:>6}  bytes {r['bytes']:>8}  scrape median {ms['median']:6.1f} ms  "
              f"p90 {ms['p90']:6.1f} ms  max {ms['max']:6.1f} ms")
    plot(out / "cardinality.png", result)
    for family, n in result["text"]["per_family"].items():
        print(f"  {family:<48} {n:>6}")
    print(f"tp={args.tp}, implemented modes {result['config']['implemented_modes']}; load average "
          f"{result['load_average']}; wrote {out / 'cardinality.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
