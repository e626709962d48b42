"""Spawn real torch.distributed (gloo) ranks on 127.0.0.1 for multi-process tests."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import traceback
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(fn: Callable, rank: int, world: int, port: int, args: tuple, queue: Any) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        queue.put((rank, "ok", fn(rank, world, *args)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, re-raised there
        queue.put((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn: Callable, world: int, *args: Any, timeout: float = 120.0) -> list[Any]:
    """Run fn(rank, world, *args) on `world` spawned gloo ranks; return results by rank, or raise."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(fn, r, world, port, args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    try:
        for _ in range(world):
            rank, status, value = queue.get(timeout=timeout)
            (results if status == "ok" else errors)[rank] = value
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    if errors:
        raise RuntimeError("\n".join(f"rank {r}: {e}" for r, e in sorted(errors.items())))
    return [results[r] for r in range(world)]
