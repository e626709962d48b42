"""One client run's measurements, read from the JSON file the engine's own benchmark client wrote."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

LATENCIES = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = ("p50", "p99")


@dataclass
class ClientResult:
    duration_s: float
    completed: int
    output_tokens: int
    output_throughput: float  # output tokens/s over the run
    request_throughput: float  # requests/s
    latencies_ms: dict[str, float]  # "ttft_p50", "tpot_p99", ...
    generated_texts: list[str]

    def summary(self) -> dict[str, Any]:
        """Everything but the texts (kept apart: they are large)."""
        out = asdict(self)
        del out["generated_texts"]
        return out


def read_vllm_result(path: Path) -> ClientResult:
    """`vllm bench serve --save-result --save-detailed --metric-percentiles 50,99`: p50_<metric>_ms, p99_..."""
    raw = json.loads(path.read_text())
    return ClientResult(
        duration_s=raw["duration"], completed=raw["completed"], output_tokens=raw["total_output_tokens"],
        output_throughput=raw["output_throughput"], request_throughput=raw["request_throughput"],
        latencies_ms={f"{m}_{p}": raw[f"{p}_{m}_ms"] for m in LATENCIES for p in PERCENTILES},
        generated_texts=list(raw.get("generated_texts", [])))


def read_sglang_result(path: Path) -> ClientResult:
    """`sglang.bench_serving --output-file F --output-details`: one JSON object per line (the last is this run);
    median_<metric>_ms and p99_<metric>_ms, with its end-to-end latency named e2e_latency."""
    raw = json.loads(path.read_text().strip().splitlines()[-1])
    names = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e_latency"}
    return ClientResult(
        duration_s=raw["duration"], completed=raw["completed"], output_tokens=raw["total_output_tokens"],
        output_throughput=raw["output_throughput"], request_throughput=raw["request_throughput"],
        latencies_ms={f"{m}_{p}": raw[f"{'median' if p == 'p50' else p}_{names[m]}_ms"] for m in LATENCIES
                      for p in PERCENTILES},
        generated_texts=list(raw.get("generated_texts", [])))
