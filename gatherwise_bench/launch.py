"""Benchmarks spawn their ranks with tp_engine's launcher; they give each rank an even share of the cores."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from gatherwise.tp_engine.launch import launch
from gatherwise.tp_engine.nodes import Nodes


def run_ranks(fn: Callable, world: int, *args: Any, backend: str = "gloo", timeout: float = 1800.0,
              nodes: Nodes | None = None) -> list[Any]:
    """fn(rank, world, *args) on spawned ranks (NCCL when backend="nccl"); this node's results by rank (all of
    them without `nodes`)."""
    threads = max(1, (os.cpu_count() or 1) // local_ranks(world, nodes))
    return launch(fn, world, *args, device="cuda" if backend == "nccl" else "cpu", timeout=timeout,
                  threads_per_rank=threads, nodes=nodes)


def local_ranks(world: int, nodes: Nodes | None) -> int:
    return world if nodes is None else len(nodes.ranks(world))
