"""Stand-in writers for the discovery faults: real processes that lay out engine directories the way an engine
does (a liveness lock per rank, rings), without torch, so hundreds of them cost little.

`python -m tests.faults._writers dead SHM N`   N directories whose writer exits at once (left behind, as after
                                                a SIGKILL): locks free, rings written
`python -m tests.faults._writers full SHM CAP` one live single-rank engine whose ring of capacity CAP is full;
                                                prints READY, then runs until stdin closes
`python -m tests.faults._writers node1 SHM ID` node 1 of a TP=2 group across two nodes (rank 1's lock and ring, a
                                                node file naming rank 1): prints READY, then records a call every
                                                10 ms until stdin closes
"""

from __future__ import annotations

import os
import sys
import threading
import time

from gatherwise.engine_hooks.call_marks import CallMarks
from gatherwise.engine_hooks.recorder import RingRecorder
from gatherwise.shm_format.liveness import LivenessLock
from gatherwise.shm_format.node_ranks import write_node_ranks
from gatherwise.shm_format.private_files import ensure_private_dir
from gatherwise.shm_format.ring import engine_dir, ring_path


def make_engine(shm: str, engine_id: int, capacity: int) -> tuple[LivenessLock, RingRecorder]:
    directory = ensure_private_dir(engine_dir(shm, engine_id))
    lock = LivenessLock(directory, 0)
    ring = RingRecorder(ring_path(shm, engine_id, 0), engine_id=engine_id, rank=0, tp_size=1, vocab=1024,
                        dtype="float32", capacity=capacity)
    return lock, ring


def fill(ring: RingRecorder, n: int) -> None:
    t = time.perf_counter_ns()
    for i in range(n):
        ring.record(CallMarks(i, 0, 1, 0, 4096, t, t + 1, t + 2, 0, 0, t + 2, t + 3, t + 4))


def node1(shm: str, engine_id: int) -> None:
    directory = ensure_private_dir(engine_dir(shm, engine_id))
    lock = LivenessLock(directory, 1)
    ring = RingRecorder(ring_path(shm, engine_id, 1), engine_id=engine_id, rank=1, tp_size=2, vocab=1024,
                        dtype="float32", capacity=1024)
    write_node_ranks(directory, 2, (1,), 1, 2)
    print("READY", flush=True)
    closed = threading.Event()

    def wait_for_stdin() -> None:
        sys.stdin.read()
        closed.set()

    threading.Thread(target=wait_for_stdin, daemon=True).start()
    call = 0
    while not closed.wait(0.01):
        t = time.perf_counter_ns()
        ring.record(CallMarks(call, 0, 1, 0, 4096, t, t + 1, t + 2, 0, 0, t + 2, t + 3, t + 4))
        call += 1
    ring.close()
    lock.close()


def main() -> None:
    what, shm, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if what == "node1":
        node1(shm, count)
        return
    if what == "dead":
        for _ in range(count):
            lock, ring = make_engine(shm, int.from_bytes(os.urandom(8), "little") >> 1, 16)
            fill(ring, 20)
            lock.close()  # as if its process had died (rings are left open, not marked closed)
        os._exit(0)  # no cleanup: the directories stay
    lock, ring = make_engine(shm, int.from_bytes(os.urandom(8), "little") >> 1, count)
    fill(ring, count + count // 8)
    print("READY", flush=True)
    sys.stdin.read()
    ring.close()
    lock.close()


if __name__ == "__main__":
    main()
