"""The engine's newest sample output as the live page shows it (GET /v1/live's `sample`): its `sample.json`
(gatherwise.shm_format.engine_sample) and how old it is.

Read again at each request: the file is small (the reader refuses more than 16 KiB) and the engine replaces it
whole, so there is nothing to keep. The reader never raises for the file: a missing, oversized or malformed one
is no sample. The age is taken on this host's wall clock, the clock the engine stamped it with (a sidecar reads
the engine directories of its own node); a stamp in the future reads as age 0.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from gatherwise.shm_format.engine_sample import EngineSample, read_sample


@dataclass(frozen=True)
class LiveSample(EngineSample):
    age_seconds: float = 0.0  # seconds since the engine finished it


def live_sample(engine_dir: str | os.PathLike[str], wall_clock: Callable[[], float] = time.time) -> LiveSample | None:
    """The engine's newest sample with its age, or None where it wrote none (or none that reads as one)."""
    sample = read_sample(engine_dir)
    if sample is None:
        return None
    age = max(0.0, wall_clock() - sample.wall_ns * 1e-9)
    return LiveSample(**dataclasses.asdict(sample), age_seconds=age)
