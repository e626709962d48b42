"""Every measurement of the lab (`python -m lab.<name>`) runs to its end at a tiny size and writes what it reports,
so none rots between the runs that produce docs/BENCHMARKS.md. The numbers are not looked at: too few calls to mean
anything, on a shared machine."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests._repo import ROOT

# measurement -> (its arguments at tiny size, the file it writes under OUT)
TINY = {
    "control_poll": (["--calls", "2000", "--out", "OUT/control_poll.json"], "control_poll.json"),
    "sidecar_ingest": (["--calls", "200", "--repeats", "1", "--out", "OUT/sidecar_ingest.json"],
                       "sidecar_ingest.json"),
    "ingest_rate": (["--records", "2000", "--repeats", "1", "--seconds", "0.2", "--out", "OUT"], "results.json"),
    "ingest_bounds": (["--capacity", "4096", "--dirs", "5", "--out", "OUT"], "results.json"),
    "hook_overhead": (["--tp", "1", "--iters", "2", "--warmup", "1", "--path-runs", "1", "--path-rounds", "4",
                       "--record-calls", "2000", "--out", "OUT"], "results.json"),
    "metrics_cardinality": (["--tp", "1", "--calls-per-cell", "1", "--scrapes", "1", "--out", "OUT"],
                            "cardinality.json"),
    "sidecar_cpu": (["--tp", "1", "--rates", "0", "--seconds", "0.5", "--out", "OUT"], "sidecar_cpu.json"),
    "api_latency": (["--waiting", "1", "--rounds", "1", "--scrapes", "2", "--out", "OUT"], "api_latency.json"),
    "auto_policy": (["--rounds", "1", "--segment", "2", "--settle", "0.5", "--cold", "3", "--out", "OUT"],
                    "auto_policy.json"),
}
LONGEST_FIRST = ("auto_policy", "sidecar_cpu", "hook_overhead", "api_latency", "metrics_cardinality", "ingest_bounds",
                 "sidecar_ingest", "ingest_rate", "control_poll")


def _lab_measurements() -> set[str]:
    return {path.stem for path in (ROOT / "lab").glob("*.py") if path.stem != "__init__"}


def _run(name: str, args: list[str], out: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", f"lab.{name}", *(a.replace("OUT", str(out)) for a in args)]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_every_measurement_has_a_tiny_run():
    # vllm_paired needs vLLM: its figure is drawn here, its measurement in vLLM's venv (make test-vllm)
    assert _lab_measurements() == set(TINY) | {"vllm_paired"}
    assert sorted(LONGEST_FIRST) == sorted(TINY)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_every_measurement_runs_at_tiny_size(tmp_path: Path) -> None:
    # Most of a tiny run is waiting (processes starting, a sidecar attaching, fixed warm-ups), so three at a time
    # keep two cores busy; the longest start first.
    def run(name: str) -> str | None:
        args, written = TINY[name]
        out = tmp_path / name
        out.mkdir()
        result = _run(name, args, out)
        if result.returncode != 0:
            return f"{name}: exit {result.returncode}\n{result.stdout[-2000:]}{result.stderr[-4000:]}"
        return None if json.loads((out / written).read_text()) else f"{name}: {written} is empty"

    with ThreadPoolExecutor(max_workers=3) as pool:
        failures = [f for f in pool.map(run, LONGEST_FIRST) if f is not None]
    assert not failures, "\n\n".join(failures)


def test_vllm_paired_draws_its_figure(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rank = {key: 1.0 for key in ("path_ms", "collective_ms", "second_op_ms", "sample_ms", "gap_ms")}
    summary = [{"batch": 1, "mode": mode, "tokens_per_s": 10.0, "ratio": 1.0, "ratio_min": 1.0, "ratio_max": 1.0,
                "ranks": {"0": rank, "1": rank}} for mode in ("all_gather", "gather", "sharded")]
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"batches": [1], "summary": summary}))
    result = _run("vllm_paired", ["--plot", str(results)], tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "vllm-paired.png").is_file()
