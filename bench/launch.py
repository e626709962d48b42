"""Spawn P local torch.distributed ranks on 127.0.0.1 and collect what each returns.

gloo on CPU; NCCL when the ranks run on CUDA (rank r on cuda:r). Each rank gets an even share of the CPU
cores for torch's intra-op threads, so P ranks do not oversubscribe a small machine.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import socket
import traceback
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(fn: Callable, rank: int, world: int, port: int, backend: str, args: tuple, out: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        out.put((rank, "ok", fn(rank, world, *args)))
    except BaseException as exc:  # noqa: BLE001 - sent to the parent, which raises it with the rank
        out.put((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn: Callable, world: int, *args: Any, backend: str = "gloo", timeout: float = 1800.0) -> list[Any]:
    """fn(rank, world, *args) on `world` spawned ranks; results by rank. Raises with every rank's error."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(fn, r, world, port, backend, args, out), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    try:
        for _ in range(world):
            try:
                rank, status, value = out.get(timeout=timeout)
            except queue_mod.Empty:
                raise TimeoutError(f"ranks did not finish within {timeout:.0f} s") from None
            (results if status == "ok" else errors)[rank] = value
            if errors:  # the other ranks are stuck in a collective with the failed one
                break
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 0.5)
            if p.is_alive():
                p.kill()
    if errors:
        raise RuntimeError("\n".join(f"rank {r}: {e}" for r, e in sorted(errors.items())))
    return [results[r] for r in range(world)]
