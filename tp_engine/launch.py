"""Spawn P local ranks in one torch.distributed group and collect what each returns.

gloo on CPU, NCCL on CUDA (rank r uses cuda:r). Every rank's failure comes back with its traceback; a rank
that dies without reporting, or a run past `timeout`, kills the rest and raises — never a hang.

Results come back through one pipe per rank, not a multiprocessing.Queue: a spawn-context Queue (or Event) is
built on named POSIX semaphores (/dev/shm/sem.mp-*), which stay in tmpfs forever when the whole process tree is
killed at once (SIGKILL, OOM) and nobody is left to unlink them. A pipe is only a pair of descriptors.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import pickle
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any, cast

from gatherwise.free_port import free_port

# The most ranks one launch spawns on a node: beyond it a run is a mistake on a CPU (or a local node), not a workload.
MAX_LOCAL_RANKS = 64
POLL_S = 0.2  # how often the launcher looks at the ranks' pipes and the deadline
EXIT_GRACE_S = 2.0  # a rank's time to exit after it reported or closed its pipe, before it is killed
AFTER_FAILURE_S = 10.0  # how long the other ranks may still report once one has failed


class LaunchError(RuntimeError):
    pass


def _rank_main(fn: Callable, rank: int, world: int, port: int, backend: str, threads: int, timeout: float,
               args: tuple, results: Any) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        if threads > 0:
            torch.set_num_threads(threads)
        if backend == "nccl":
            torch.cuda.set_device(rank)
        wait = datetime.timedelta(seconds=timeout)
        dist.init_process_group(backend, store=_loopback_store(rank, world, port, wait), rank=rank,
                                world_size=world, timeout=wait)
        # plain pickle, not the pipe's: torch would pass tensors as shared-memory handles that die with this process
        results.send((rank, "ok", pickle.dumps(fn(rank, world, *args))))
    except BaseException as exc:
        results.send((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        results.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def _loopback_store(rank: int, world: int, port: int, timeout: datetime.timedelta) -> Any:
    """The rendezvous store, its server (rank 0) listening on 127.0.0.1 only: by default TCPStore listens on every
    interface for the engine's whole life, although every rank of a local launch is on this host."""
    import torch.distributed as dist

    if rank != 0:
        return dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timeout)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(world)
    try:
        return dist.TCPStore("127.0.0.1", port, world, is_master=True, timeout=timeout, wait_for_workers=False,
                             master_listen_fd=listener.fileno())
    finally:
        listener.detach()  # the store owns the descriptor now


def launch(fn: Callable, world: int, *args: Any, device: str = "cpu", timeout: float = 300.0,
           threads_per_rank: int = 1) -> list[Any]:
    """Run fn(rank, world, *args) on `world` spawned ranks; return the results by rank, or raise LaunchError.

    `fn` must be importable (module level). threads_per_rank=1 keeps P ranks from oversubscribing the CPU.
    """
    if world < 1:
        raise ValueError(f"world size must be >= 1, got {world}")
    backend = "nccl" if device == "cuda" else "gloo"
    ctx = mp.get_context("spawn")
    pipes = [ctx.Pipe(duplex=False) for _ in range(world)]  # (parent's reader, rank's writer) per rank
    port = free_port()
    procs = [ctx.Process(target=_rank_main, daemon=True,
                         args=(fn, r, world, port, backend, threads_per_rank, timeout, args, pipes[r][1]))
             for r in range(world)]
    for p in procs:
        p.start()
    for _, writer in pipes:
        writer.close()  # the rank holds its own copy; EOF on the reader then means the rank is gone
    readers = {pipes[r][0]: r for r in range(world)}
    done: dict[int, Any] = {}
    errors: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(done) + len(errors) < world:
            ready = cast("list[mp_connection.Connection]", mp_connection.wait(list(readers), timeout=POLL_S))
            for reader in ready:
                r = readers.pop(reader)
                try:
                    rank, status, value = reader.recv()
                except (EOFError, OSError):
                    procs[r].join(timeout=EXIT_GRACE_S)
                    errors[r] = f"died without reporting (exit code {procs[r].exitcode})"
                    continue
                finally:
                    reader.close()
                if status == "ok":
                    done[rank] = pickle.loads(value)
                else:
                    errors[rank] = value
            if errors:  # the others usually fail alike within moments; don't wait out the full timeout
                deadline = min(deadline, time.monotonic() + AFTER_FAILURE_S)
            if time.monotonic() > deadline:
                pending = [r for r in range(world) if r not in done and r not in errors]
                errors.update({r: f"no result within {timeout:g}s (or {AFTER_FAILURE_S:g}s after another rank failed)"
                               for r in pending})
    finally:
        for reader in readers:
            reader.close()
        for p in procs:
            p.join(timeout=EXIT_GRACE_S)
            if p.is_alive():
                p.kill()
                p.join(timeout=EXIT_GRACE_S)
    if errors:
        raise LaunchError(f"{len(errors)} of {world} ranks failed:\n" +
                          "\n".join(f"rank {r}: {e}" for r, e in sorted(errors.items())))
    return [done[r] for r in range(world)]

