"""Wait for a quieter machine before a server start: on shared cores another job's load moves every number."""

from __future__ import annotations

import os
import sys
import time

CHECK_EVERY_S = 60.0


def wait_for_load(max_load: float | None, max_wait_s: float) -> float:
    """Sleep while the 1-minute load average is above `max_load` (at most `max_wait_s`); returns the load at the
    start. `max_load` None: no waiting."""
    waited = 0.0
    while True:
        load = os.getloadavg()[0]
        if max_load is None or load <= max_load or waited >= max_wait_s:
            return load
        print(f"[bench serve] load average {load:.2f} > {max_load}: waiting {CHECK_EVERY_S:.0f} s", file=sys.stderr)
        time.sleep(CHECK_EVERY_S)
        waited += CHECK_EVERY_S
