"""Spawn this node's ranks of one torch.distributed group and collect what each returns.

One node by default: all P ranks here, the rendezvous on 127.0.0.1. With `Nodes` (tp_engine/nodes.py) the group
spans nodes: this node spawns its share of the global ranks and rank 0's node serves the store on its address;
gloo crosses nodes on the interface GLOO_SOCKET_IFNAME names (else the one the host name resolves to).
gloo on CPU, NCCL on CUDA (a node's i-th rank uses cuda:i). Every rank's failure comes back with its traceback; a rank
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
from gatherwise.tp_engine.nodes import Nodes

# The most ranks one launch spawns on a node: beyond it a run is a mistake on a CPU (or a local node), not a workload.
MAX_LOCAL_RANKS = 64
POLL_S = 0.2  # how often the launcher looks at the ranks' pipes and the deadline
EXIT_GRACE_S = 2.0  # a rank's time to exit after it reported or closed its pipe, before it is killed
AFTER_FAILURE_S = 10.0  # how long the other ranks may still report once one has failed


class LaunchError(RuntimeError):
    pass


def _rank_main(fn: Callable, rank: int, world: int, local: int, nodes: Nodes, backend: str, threads: int,
               timeout: float, args: tuple, results: Any) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR=nodes.addr, MASTER_PORT=str(nodes.port))
    try:
        if threads > 0:
            torch.set_num_threads(threads)
        if backend == "nccl":
            torch.cuda.set_device(local)
        wait = datetime.timedelta(seconds=timeout)
        dist.init_process_group(backend, store=_store(rank, world, nodes, wait), rank=rank, world_size=world,
                                timeout=wait)
        # plain pickle, not the pipe's: torch would pass tensors as shared-memory handles that die with this process
        results.send((rank, "ok", pickle.dumps(fn(rank, world, *args))))
    except BaseException as exc:
        results.send((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        results.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def _store(rank: int, world: int, nodes: Nodes, timeout: datetime.timedelta) -> Any:
    """The rendezvous store, its server (rank 0) listening on `nodes.addr` only: by default TCPStore listens on
    every interface for the engine's whole life, although the ranks reach it on that one address."""
    import torch.distributed as dist

    if rank != 0:
        return dist.TCPStore(nodes.addr, nodes.port, world, is_master=False, timeout=timeout)
    family, kind, proto, _, sockaddr = socket.getaddrinfo(nodes.addr, nodes.port, type=socket.SOCK_STREAM)[0]
    listener = socket.socket(family, kind, proto)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(sockaddr)
    listener.listen(world)
    try:
        return dist.TCPStore(nodes.addr, nodes.port, world, is_master=True, timeout=timeout, wait_for_workers=False,
                             master_listen_fd=listener.fileno())
    finally:
        listener.detach()  # the store owns the descriptor now


def launch(fn: Callable, world: int, *args: Any, device: str = "cpu", timeout: float = 300.0,
           threads_per_rank: int = 1, nodes: Nodes | None = None) -> list[Any]:
    """Run fn(rank, world, *args) on spawned ranks; return this node's results by rank, or raise LaunchError.

    Without `nodes` all `world` ranks run here and every result comes back. With `nodes` this is node
    `nodes.rank`: it runs only the global ranks `nodes.ranks(world)` and returns only their results, in rank
    order (the other nodes' results stay on their nodes). `fn` must be importable (module level).
    threads_per_rank=1 keeps the ranks from oversubscribing the CPU.
    """
    if world < 1:
        raise ValueError(f"world size must be >= 1, got {world}")
    here = nodes or Nodes(1, 0, "127.0.0.1", free_port())
    ranks = here.ranks(world)
    backend = "nccl" if device == "cuda" else "gloo"
    ctx = mp.get_context("spawn")
    pipes = {r: ctx.Pipe(duplex=False) for r in ranks}  # (parent's reader, rank's writer) per rank
    procs = {r: ctx.Process(target=_rank_main, daemon=True,
                            args=(fn, r, world, i, here, backend, threads_per_rank, timeout, args, pipes[r][1]))
             for i, r in enumerate(ranks)}
    for p in procs.values():
        p.start()
    for _, writer in pipes.values():
        writer.close()  # the rank holds its own copy; EOF on the reader then means the rank is gone
    readers = {pipes[r][0]: r for r in ranks}
    done: dict[int, Any] = {}
    errors: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    # a node waiting on a peer that never came shows up as a timeout here: say where the peers were expected
    peers = "" if here.count == 1 else (f"; did every one of the {here.count} nodes start, and can each reach "
                                        f"{here.addr}:{here.port}?")
    try:
        while len(done) + len(errors) < len(ranks):
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
                pending = [r for r in ranks if r not in done and r not in errors]
                errors.update({r: f"no result within {timeout:g}s (or {AFTER_FAILURE_S:g}s after another rank "
                                  f"failed){peers}" for r in pending})
    finally:
        for reader in readers:
            reader.close()
        for p in procs.values():
            p.join(timeout=EXIT_GRACE_S)
            if p.is_alive():
                p.kill()
                p.join(timeout=EXIT_GRACE_S)
    if errors:
        where = "" if here.count == 1 else f" on {here.describe(world)}"
        raise LaunchError(f"{len(errors)} of {len(ranks)} ranks{where} failed:\n" +
                          "\n".join(f"rank {r}: {e}" for r, e in sorted(errors.items())))
    return [done[r] for r in ranks]
