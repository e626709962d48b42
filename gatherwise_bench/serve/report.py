"""The benchmark's results: per configuration and cell the mean over its passes, ratios against the plain engine,
whether greedy outputs equal the plain engine's, the text table and results.json."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from gatherwise.bench.serve.configurations import BASELINE
from gatherwise.bench.serve.greedy_match import TokenCounter, compare_outputs

TABLE_METRICS = ("ttft", "tpot", "itl")


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def greedy_matches(runs: list[dict[str, Any]], model: Path) -> dict[tuple[str, int, str], dict[str, Any]]:
    """(configuration, pass, cell) -> comparison with the plain engine's first pass, for every greedy cell. The
    plain engine's own later passes are compared too: they show whether the engine itself repeats its outputs."""
    reference = next((r["outputs"] for r in runs if r["configuration"] == BASELINE), None)
    if reference is None:
        return {}
    tokens = TokenCounter(model)
    out = {}
    for run in runs:
        for key, texts in run["outputs"].items():
            if key.startswith("greedy") and key in reference:
                out[(run["configuration"], run["pass"], key)] = compare_outputs(reference[key], texts, tokens)
    return out


def summarize(runs: list[dict[str, Any]], model: Path) -> list[dict[str, Any]]:
    matches = greedy_matches(runs, model)
    measured: dict[tuple[str, str], list[dict[str, Any]]] = {}
    passes: dict[tuple[str, str], list[int]] = {}
    for run in runs:
        for cell in run["cells"]:
            if cell["phase"] == "measured":
                measured.setdefault((run["configuration"], cell["cell"]), []).append(cell)
                passes.setdefault((run["configuration"], cell["cell"]), []).append(run["pass"])
    rows = []
    for (name, key), cells in measured.items():
        first = cells[0]
        shares = [c["logits_path"]["share"] if c["logits_path"] else None for c in cells]
        per_call = [c["logits_path"]["path_us_per_call"] if c["logits_path"] else None for c in cells]
        row = {"configuration": name, "cell": key, "sampling": first["sampling"], "concurrency": first["concurrency"],
               "passes": len(cells),
               "output_throughput": _mean([c["output_throughput"] for c in cells]),
               "output_throughput_per_pass": [c["output_throughput"] for c in cells],
               "request_throughput": _mean([c["request_throughput"] for c in cells]),
               "latencies_ms": {m: _mean([c["latencies_ms"][m] for c in cells]) for m in first["latencies_ms"]},
               "tpot_p99_per_pass": [c["latencies_ms"]["tpot_p99"] for c in cells],
               "logits_path_share": _mean(shares), "logits_path_us_per_call": _mean(per_call),
               "calls_by_mode": [c["logits_path"]["calls_by_mode"] if c["logits_path"] else None for c in cells],
               "topp_rows": _summed_topp_rows(cells), "cpu_cores": _mean_cores(cells)}
        if first["sampling"] == "greedy":
            found = [matches.get((name, p, key)) for p in passes[(name, key)]]
            row["greedy_vs_plain"] = found
            compared = [m for m in found if m is not None]  # None: no plain run to compare with
            known = bool(found) and len(compared) == len(found)
            row["greedy_equal_to_plain"] = all(m["all_equal"] for m in compared) if known else None
        rows.append(row)
    baseline = {r["cell"]: r for r in rows if r["configuration"] == BASELINE}
    for row in rows:
        plain = baseline.get(row["cell"])
        row["throughput_vs_plain"] = row["output_throughput"] / plain["output_throughput"] if plain else None
        row["tpot_p99_vs_plain"] = (row["latencies_ms"]["tpot_p99"] / plain["latencies_ms"]["tpot_p99"]
                                    if plain and plain["latencies_ms"]["tpot_p99"] else None)
    return rows


def auto_decisions(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every switch the auto policy made, per auto run: the bucket, from and to, seconds after `PUT /v1/mode auto`,
    and the paired evidence it acted on (ratio for the bucket's mix, per kind, the mix itself)."""
    out = []
    for run in runs:
        start = run.get("auto_put_time")
        for d in run.get("decisions") or ():
            if d["reason"] != "auto":
                continue
            bucket = d["buckets"][0]
            paired = d["evidence"].get("paired", {}).get(d["mode"], {})
            out.append({"pass": run["pass"], "bucket": bucket, "from": d["previous"].get(bucket), "to": d["mode"],
                        "seconds_after_auto": None if start is None else round(d["time"] - start, 1),
                        "ratio": paired.get("ratio"), "probes": paired.get("probes"), "calls": paired.get("calls"),
                        "kinds": {k: round(v["ratio"], 3) for k, v in (paired.get("kinds") or {}).items()},
                        "mix": d["evidence"].get("mix")})
    return out


def in_start_comparison(runs: list[dict[str, Any]], against: str) -> list[dict[str, Any]]:
    """Per auto run and cell: output tok/s of its auto rounds (the measured one and the last) and of its rounds
    pinned to `against` in the same server start, and their ratio; then per cell the mean ratio over passes."""
    out = []
    for run in runs:
        by_phase: dict[tuple[str, str], list[float]] = {}
        for cell in run["cells"]:
            if cell["phase"] in ("measured", "auto", "pinned"):
                side = "pinned" if cell["phase"] == "pinned" else "auto"
                by_phase.setdefault((cell["cell"], side), []).append(cell["output_throughput"])
        for key in dict.fromkeys(k for k, _ in by_phase):
            auto, pinned = by_phase.get((key, "auto")), by_phase.get((key, "pinned"))
            if not auto or not pinned:
                continue
            out.append({"configuration": run["configuration"], "pass": run["pass"], "cell": key,
                        "against": against, "auto_per_round": auto, "pinned_per_round": pinned,
                        "auto_vs_pinned": statistics.fmean(auto) / statistics.fmean(pinned)})
    return out


def format_in_start(comparisons: list[dict[str, Any]]) -> str:
    lines = ["auto against a pinned mode in the same server start (rounds A B B A: the measured one, pinned, pinned, "
             "auto again; output tok/s per round)"]
    by_cell: dict[tuple[str, str], list[float]] = {}
    for c in comparisons:
        by_cell.setdefault((c["configuration"], c["cell"]), []).append(c["auto_vs_pinned"])
        lines.append(f"  {c['configuration']} pass {c['pass']} {c['cell']}: auto "
                     + "/".join(f"{v:.2f}" for v in c["auto_per_round"]) + f", {c['against']} "
                     + "/".join(f"{v:.2f}" for v in c["pinned_per_round"]) + f": {c['auto_vs_pinned']:.3f}x")
    for (name, key), ratios in by_cell.items():
        lines.append(f"  {name} {key}: auto / pinned {statistics.fmean(ratios):.3f}x over {len(ratios)} passes")
    if not comparisons:
        lines.append("  none")
    return "\n".join(lines)


def format_decisions(decisions: list[dict[str, Any]]) -> str:
    lines = ["auto: switches (bucket: from -> to, seconds after PUT auto, mix-weighted ratio, per kind, mix)"]
    for d in decisions:
        lines.append(f"  pass {d['pass']} bucket {d['bucket']:>3}: {d['from']} -> {d['to']} "
                     f"at {d['seconds_after_auto']} s,"
                     f" ratio {_fmt(d['ratio'], '.3f')} from {d['probes']} probes / {d['calls']} calls,"
                     f" kinds {d['kinds']}, mix {d['mix']}")
    if not decisions:
        lines.append("  none")
    return "\n".join(lines)


def _summed_topp_rows(cells: list[dict[str, Any]]) -> dict[str, int] | None:
    """Top-p rows sampled sharded and those of them that took the full-row fallback, over the cell's passes."""
    counted = [c["logits_path"].get("topp_rows") for c in cells if c["logits_path"]]
    if not counted or any(n is None for n in counted):
        return None
    return {kind: sum(n[kind] for n in counted) for kind in ("rows", "fallback_rows")}


def _mean_cores(cells: list[dict[str, Any]]) -> dict[str, float]:
    """Cores each process kept busy during the cell, the mean over its passes (a pass that did not see a process
    counts it as 0)."""
    seen = [c.get("cpu_cores") or {} for c in cells]
    labels = sorted({label for cores in seen for label in cores})
    return {label: round(statistics.fmean(cores.get(label, 0.0) for cores in seen), 3) for label in labels}


def format_cpu_table(rows: list[dict[str, Any]], configurations: list[str]) -> str:
    """Cores kept busy during each measured cell: the host, the engine's processes, the sidecar, the client."""
    lines = ["CPU: cores kept busy in each measured cell, mean over passes (engine processes and sidecar over the "
             "measured duration; client and host over the client's whole run)"]
    for row in _in_table_order(rows, configurations):
        cores = row.get("cpu_cores") or {}
        rest = "  ".join(f"{label} {value:.2f}" for label, value in cores.items() if label != "host")
        lines.append(f"{row['configuration']:>18} {row['sampling']:>11} {row['concurrency']:>4}  "
                     f"host {_fmt(cores.get('host'), '.2f')}  {rest}")
    return "\n".join(lines)


def _fallback_text(row: dict[str, Any]) -> str:
    counted = row.get("topp_rows")
    return "-" if not counted or not counted["rows"] else f"{counted['fallback_rows']}/{counted['rows']}"


def _in_table_order(rows: list[dict[str, Any]], configurations: list[str]) -> list[dict[str, Any]]:
    """Rows by sampling, then concurrency, then the configurations' order on the command line."""
    order = {name: i for i, name in enumerate(configurations)}
    return sorted(rows, key=lambda r: (r["sampling"], r["concurrency"], order.get(r["configuration"], 99)))


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(rows: list[dict[str, Any]], configurations: list[str]) -> str:
    head = (f"{'configuration':>18} {'sampling':>11} {'conc':>4} {'tok/s':>8} {'x plain':>7} {'req/s':>6} "
            + " ".join(f"{m.upper() + ' p50/p99 (ms)':>19}" for m in TABLE_METRICS)
            + f" {'TPOT p99 x':>10} {'path share':>10} {'fallback':>11} {'greedy = plain':>14}")
    lines = [head]
    for row in _in_table_order(rows, configurations):
        lat = row["latencies_ms"]
        greedy = row.get("greedy_equal_to_plain")
        lines.append(
            f"{row['configuration']:>18} {row['sampling']:>11} {row['concurrency']:>4} "
            f"{row['output_throughput']:>8.1f} {_fmt(row['throughput_vs_plain'], '.3f'):>7} "
            f"{row['request_throughput']:>6.2f} "
            + " ".join(f"{lat[m + '_p50']:>9.1f}/{lat[m + '_p99']:<9.1f}" for m in TABLE_METRICS)
            + f" {_fmt(row['tpot_p99_vs_plain'], '.3f'):>10} "
            f"{'-' if row['logits_path_share'] is None else format(100 * row['logits_path_share'], '.1f') + ' %':>10} "
            f"{_fallback_text(row):>11} "
            f"{'-' if greedy is None else ('yes' if greedy else 'NO'):>14}")
    return "\n".join(lines)


def write_results(path: Path, meta: dict[str, Any], runs: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    """results.json (everything but the generated texts) and outputs.json (the texts, per run and cell)."""
    slim = [{k: v for k, v in run.items() if k != "outputs"} for run in runs]
    path.write_text(json.dumps({**meta, "summary": rows, "runs": slim}, indent=1, default=str))
    (path.parent / "outputs.json").write_text(json.dumps(
        [{"configuration": r["configuration"], "pass": r["pass"], "outputs": r["outputs"]} for r in runs]))
