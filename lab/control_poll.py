"""Cost of ControlBlockSource.poll() per logits call (rank 0's per-call control overhead), JSON to stdout/file.

    .venv/bin/python -m lab.control_poll [--calls 1000000] [--out out/control_poll.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from gatherwise.engine_hooks.control_block import ControlBlockSource
from gatherwise.modes import Mode, ModeTable
from gatherwise.shm_format.control import control_path


def measure(calls: int, repeats: int = 5) -> dict:
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as shm:
        path = control_path(shm, 1)
        os.makedirs(os.path.dirname(path))
        source = ControlBlockSource(path, engine_id=1, tp_size=2, table=ModeTable.uniform(Mode.ALL_GATHER))
        poll = source.poll
        per_call = []
        empty = []
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            for i in range(calls):
                poll(i)
            per_call.append((time.perf_counter_ns() - t0) / calls)
            t0 = time.perf_counter_ns()
            for _i in range(calls):
                pass
            empty.append((time.perf_counter_ns() - t0) / calls)
        source.close()
    return {"calls": calls, "repeats": repeats, "poll_ns_median": statistics.median(per_call),
            "poll_ns_min": min(per_call), "loop_overhead_ns_median": statistics.median(empty),
            "poll_ns_runs": per_call}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    result = measure(args.calls)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
