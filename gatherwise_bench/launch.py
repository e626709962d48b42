"""Benchmarks spawn their ranks with tp_engine's launcher; they give each rank an even share of the cores."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from gatherwise.tp_engine.launch import launch


def run_ranks(fn: Callable, world: int, *args: Any, backend: str = "gloo", timeout: float = 1800.0) -> list[Any]:
    """fn(rank, world, *args) on `world` spawned ranks (NCCL when backend="nccl"); results by rank."""
    threads = max(1, (os.cpu_count() or 1) // world)
    return launch(fn, world, *args, device="cuda" if backend == "nccl" else "cpu", timeout=timeout,
                  threads_per_rank=threads)
