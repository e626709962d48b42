"""A telemetry stand-in for sidecar benchmarks: P real rings and a real control block, no torch, no collectives.

What the sidecar sees of an engine is its shared memory: one ring per rank and rank 0's control block. This
writes both with the engine's own writers (engine_hooks.recorder.RingRecorder, engine_hooks.control_block), from
one process, at a chosen call rate, with synthetic durations per mode. It follows the control block like rank 0
does (the mode of a call comes from the table last requested, applied at once), so the sidecar's policy, API and
metrics run exactly as against a real engine. Benchmarks only: it measures the sidecar, never the engine.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Sequence
from http import HTTPStatus
from pathlib import Path

import httpx

from gatherwise.engine_hooks.call_marks import CallMarks
from gatherwise.engine_hooks.control_block import ControlBlockSource
from gatherwise.engine_hooks.recorder import RingRecorder
from gatherwise.engine_hooks.table_source import AppliedStatus
from gatherwise.modes import Mode, ModeTable, bucket_of
from gatherwise.shm_format.control import control_path
from gatherwise.shm_format.ring import engine_dir, ring_path

VOCAB = 32000
ATTACH_POLL_S = 0.1
LOGITS_BYTES = 4  # float32
RESOLVE_SHARE = 0.5  # of sharded calls that have temperature/top-p rows (a second collective)
# Synthetic critical path per mode: a fixed cost plus a per-row cost (ns). Gather is cheaper at small batches,
# the third code (sharded) at large ones, so a policy has crossovers to find.
COST_NS = {0: (300_000, 40_000), 1: (200_000, 60_000), 2: (350_000, 2_000), 3: (400_000, 50_000)}


class TelemetryStandIn:
    def __init__(self, shm_dir: str | os.PathLike, tp: int, *, capacity: int = 1 << 16, engine_id: int | None = None,
                 initial: ModeTable | None = None, control: bool = True, seed: int = 0) -> None:
        self.engine_id = engine_id if engine_id is not None else random.Random(seed).getrandbits(63) | 1
        self.tp = tp
        Path(engine_dir(shm_dir, self.engine_id)).mkdir(parents=True, exist_ok=True)
        self.table = initial or ModeTable.uniform(Mode.ALL_GATHER)
        self.control = (ControlBlockSource(control_path(shm_dir, self.engine_id), engine_id=self.engine_id,
                                           tp_size=tp, table=self.table) if control else None)
        self.rings = [RingRecorder(ring_path(shm_dir, self.engine_id, r), engine_id=self.engine_id, rank=r,
                                   tp_size=tp, vocab=VOCAB, dtype="float32", capacity=capacity) for r in range(tp)]
        self.call_index = 0
        self.epoch = 0
        self._applied_seq = 0
        self._rng = random.Random(seed)

    def call(self, rows: int, mode: int | None = None) -> int:
        """Record one call of `rows` rows on every rank (mode: the control table's unless given). Returns mode."""
        ci = self.call_index
        if self.control is not None:
            request = self.control.poll(ci)
            if request is not None and request.seq != self._applied_seq:
                self._applied_seq, self.table = request.seq, request.table
                self.epoch += 1
                self.control.report(AppliedStatus(request.seq, ci, request.table, self.epoch))
        if mode is None:
            mode = int(self.table.modes[bucket_of(rows)])
        fixed, per_row = COST_NS.get(mode, COST_NS[3])
        cost = int((fixed + per_row * rows) * (0.9 + 0.2 * self._rng.random()))
        now = time.perf_counter_ns()
        nbytes = rows * VOCAB * LOGITS_BYTES // self.tp
        resolve = self._rng.random() < RESOLVE_SHARE
        for rank, ring in enumerate(self.rings):
            t0 = now + 1_000 * rank
            coll_end = t0 + cost // 2
            samples_here = mode in (Mode.ALL_GATHER, Mode.SHARDED) or rank == 0
            s_end = coll_end + (cost // 4 if samples_here else 0)
            if mode == Mode.GATHER:  # rank 0 samples, then the token broadcast
                b0, b1 = s_end, s_end + cost // 8
                ring.record(CallMarks(ci, mode, rows, self.epoch, nbytes, t0, t0 + 500, coll_end, b0, b1,
                                        coll_end, s_end, b1 + 500))
            elif mode == Mode.SHARDED and resolve:  # sharded with temperature/top-p rows: the second collective
                r0, r1 = s_end, s_end + cost // 16
                ring.record(CallMarks(ci, mode, rows, self.epoch, rows * 16, t0, t0 + 500, coll_end, r0, r1,
                                        coll_end, s_end, r1 + 500, resolve_nbytes=rows * 8, topp_rows=rows,
                                        fallback_rows=int(ci % 7 == 1)))
            else:
                ring.record(CallMarks(ci, mode, rows, self.epoch, nbytes, t0, t0 + 500, coll_end, 0, 0, coll_end,
                                        s_end, s_end + 500))
        self.call_index += 1
        return mode

    def run(self, seconds: float, rate: float, sizes: Sequence[int]) -> int:
        """Calls at `rate` per second for `seconds`, cycling through `sizes`. Returns calls made."""
        period = 1.0 / rate
        deadline = time.monotonic() + seconds
        next_at = time.monotonic()
        n = 0
        while True:
            now = time.monotonic()
            if now >= deadline:
                return n
            if now < next_at:
                time.sleep(min(next_at - now, deadline - now))
                continue
            self.call(sizes[n % len(sizes)])
            n += 1
            next_at += period
            if next_at < now - 1.0:  # fell far behind (a loaded host): do not burst to catch up
                next_at = now

    def close(self, unlink: bool = True) -> None:
        for ring in self.rings:
            ring.close(unlink=unlink)
        if self.control is not None:
            self.control.close()

    def wait_attached(self, sidecar_url: str, timeout_s: float) -> None:
        """Make calls until the sidecar at `sidecar_url` has attached this engine (rings ingested, control block
        found: GET /v1/mode answers 200)."""
        deadline = time.monotonic() + timeout_s
        while httpx.get(f"{sidecar_url}/v1/mode", timeout=5).status_code != HTTPStatus.OK:
            if time.monotonic() > deadline:
                raise RuntimeError("sidecar did not attach the stand-in engine")
            self.call(1)
            time.sleep(ATTACH_POLL_S)
