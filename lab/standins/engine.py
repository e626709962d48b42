"""A stand-in engine for the sidecar: what a TP=1 engine lays out in shared memory (liveness lock, ring, control
block), written by the engine side's own code, with no model behind it. Rank 0 applies the newest command only
when told (`apply`), so a request that waits for a switch waits as long as the caller wants."""

from __future__ import annotations

import os

from gatherwise.engine_hooks.control_block import ControlBlockSource
from gatherwise.engine_hooks.recorder import RingRecorder
from gatherwise.engine_hooks.table_source import AppliedStatus
from gatherwise.modes import Mode, ModeTable
from gatherwise.shm_format.control import control_path
from gatherwise.shm_format.liveness import LivenessLock
from gatherwise.shm_format.private_files import ensure_private_dir
from gatherwise.shm_format.ring import engine_dir, ring_path


class StandinEngine:
    def __init__(self, shm_dir: str, table: ModeTable | None = None) -> None:
        self.engine_id = int.from_bytes(os.urandom(8), "little") >> 1
        self.dir = ensure_private_dir(engine_dir(shm_dir, self.engine_id))
        self.lock = LivenessLock(self.dir, 0)
        self.ring = RingRecorder(ring_path(shm_dir, self.engine_id, 0), engine_id=self.engine_id, rank=0, tp_size=1,
                                 vocab=1024, dtype="float32", capacity=64)
        self.block = ControlBlockSource(control_path(shm_dir, self.engine_id), engine_id=self.engine_id, tp_size=1,
                                        table=table or ModeTable.uniform(Mode.ALL_GATHER))
        self.calls = self.epoch = self.applied_seq = 0

    def apply(self) -> int:
        """Rank 0's next call: it adopts the newest command, as the logits path does; returns the seq it runs."""
        self.calls += 1
        request = self.block.poll(self.calls)
        if request is not None and request.seq != self.applied_seq:
            self.epoch += 1
            self.applied_seq = request.seq
            self.block.report(AppliedStatus(request.seq, self.calls, request.table, self.epoch))
        return self.applied_seq

    def close(self) -> None:
        self.block.close()
        self.ring.close()
        self.lock.close()
