"""Sidecar ingest pipeline rate: ring records -> cross-rank join -> histograms (-> traces), on one core.

    python -m lab.sidecar_ingest [--calls 50000] [--tp 2] [--repeats 5] [--trace-ratio 0.01] [--out FILE]

lab/ingest_rate.py measures RingReader alone; this measures everything Ingest.poll_once() does per record.
The rings are filled by a RingRecorder first (not timed). Reported: records/s of the reader's CPU time
(time.process_time, so other load on the machine does not count), median and best of --repeats, with tracing off
and with --trace-ratio of calls traced into an in-memory exporter. Target: >= 200k records/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gatherwise.engine_hooks.call_marks import CallMarks
from gatherwise.engine_hooks.recorder import RingRecorder
from gatherwise.shm_format.ring import engine_dir, ring_path
from gatherwise.sidecar.ingest.hooks_off import HooksOffWatch
from gatherwise.sidecar.ingest.poll import Ingest
from gatherwise.sidecar.metrics.record_histograms import RecordHistograms
from gatherwise.sidecar.traces.tracer import CallTracer, new_provider

TARGET = 200_000


def fill(shm: Path, engine_id: int, tp: int, calls: int) -> None:
    Path(engine_dir(shm, engine_id)).mkdir(parents=True)
    for rank in range(tp):
        rec = RingRecorder(ring_path(shm, engine_id, rank), engine_id=engine_id, rank=rank, tp_size=tp,
                           vocab=32000, dtype="float32", capacity=calls + 16)
        for i in range(calls):
            t0 = 1_000_000 + 20_000 * i + 300 * rank
            if i % 3:
                rec.record(CallMarks(i, 0, 1 + i % 64, 0, 4096, t0, t0 + 5, t0 + 400, 0, 0, t0 + 400, t0 + 500,
                                       t0 + 510))
            else:
                s_end = t0 + 500 if rank == 0 else t0 + 400
                rec.record(CallMarks(i, 1, 1 + i % 64, 0, 2048, t0, t0 + 5, t0 + 400, s_end, s_end + 100, t0 + 400,
                                       s_end, s_end + 110))
        rec.close()


def one_run(shm: Path, trace_ratio: float) -> float:
    tracer = None
    if trace_ratio > 0:
        tracer = CallTracer(new_provider("bench", SimpleSpanProcessor(InMemorySpanExporter())),
                            sample_ratio=trace_ratio)
    ingest = Ingest(shm, RecordHistograms(), HooksOffWatch(shm), tracer, join_timeout=3600)
    c0 = time.process_time()
    n = ingest.poll_once().records
    return n / (time.process_time() - c0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.sidecar_ingest", description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=50_000)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--trace-ratio", type=float, default=0.01)
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args(argv)
    base = "/dev/shm" if Path("/dev/shm").is_dir() else None
    results = {"calls": args.calls, "tp": args.tp, "records": args.calls * args.tp, "target": TARGET}
    with tempfile.TemporaryDirectory(dir=base) as d:
        fill(Path(d), 0x5EED, args.tp, args.calls)
        for name, ratio in (("no_traces", 0.0), (f"traces_{args.trace_ratio:g}", args.trace_ratio)):
            rates = [one_run(Path(d), ratio) for _ in range(args.repeats)]
            results[name] = {"median_records_per_s": statistics.median(rates), "best_records_per_s": max(rates)}
            print(f"{name:>14}: median {statistics.median(rates):>10,.0f} records/s  best {max(rates):>10,.0f} "
                  f"(target {TARGET:,})")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
