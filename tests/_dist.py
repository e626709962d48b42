"""Real torch.distributed (gloo) ranks on 127.0.0.1 for multi-process tests: tp_engine's launcher."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gatherwise.free_port import free_port
from gatherwise.tp_engine.launch import launch

__all__ = ["free_port", "run_ranks"]


def run_ranks(fn: Callable, world: int, *args: Any, timeout: float = 120.0) -> list[Any]:
    """Run fn(rank, world, *args) on `world` spawned gloo ranks; results by rank, or LaunchError (a RuntimeError)
    carrying every failed rank's traceback. Never hangs past `timeout`."""
    return launch(fn, world, *args, timeout=timeout)
