"""`gatherwise bench serve --quick` run for function only (tests/vllm, tests/sglang): the real server started per
configuration, the engine's own client, the sidecar's counters, the report. Timings are never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests._engine_harness import clean_env
from tests._repo import ROOT

QUICK_TIMEOUT_S = 600


def run_quick(engine: str, out: Path) -> dict:
    """One `--quick` run into `out`, on real prompts (each engine's client reads them as its own dataset file);
    returns its results.json (with the table under "table")."""
    command = [sys.executable, "-m", "gatherwise.cli", "bench", "serve", "--engine", engine, "--quick",
               "--prompts", "real", "--out", str(out / "results"), "--models-dir", str(out / "models")]
    proc = subprocess.run(command, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=QUICK_TIMEOUT_S)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-8000:]
    (run_dir,) = (out / "results").iterdir()
    results = json.loads((run_dir / "results.json").read_text())
    results["table"] = (run_dir / "table.txt").read_text()
    return results


def check_quick(results: dict) -> None:
    """Both configurations ran once, each a warm-up round then the measured pass, every request completed, the
    client's numbers are there, the pinned mode is the mode that ran, the plain engine has no gatherwise numbers,
    and greedy outputs were compared."""
    assert results["order"] == ["plain", "gather"] and results["warmup_rounds"] == 1
    assert results["prompts"]["source"] == "pydoc_data.topics"
    runs = {run["configuration"]: run for run in results["runs"]}
    assert set(runs) == {"plain", "gather"}
    for run in runs.values():
        warmup, measured = run["cells"]  # every configuration warms up alike, with prompts of its own
        assert (warmup["phase"], measured["phase"]) == ("warmup", "measured") and warmup["seed"] != measured["seed"]
        for cell in (warmup, measured):
            assert cell["completed"] == cell["num_prompts"] and cell["output_tokens"] > 0
            assert set(cell["latencies_ms"]) >= {"ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "itl_p50",
                                                 "itl_p99"}
    assert runs["plain"]["cells"][1]["logits_path"] is None and "engine" not in runs["plain"]
    path = runs["gather"]["cells"][1]["logits_path"]
    assert path["calls"] > 0 and path["share"] is not None
    assert set(path["calls_by_mode"]) == {"gather"}, path  # greedy batches all run the pinned mode
    assert set(runs["gather"]["mode"]["active"].values()) == {"gather"}
    rows = {row["configuration"]: row for row in results["summary"]}
    assert rows["gather"]["throughput_vs_plain"] is not None
    (match,) = rows["gather"]["greedy_vs_plain"]
    assert match["requests"] == runs["gather"]["cells"][0]["num_prompts"]
    assert "gather" in results["table"] and "plain" in results["table"]
