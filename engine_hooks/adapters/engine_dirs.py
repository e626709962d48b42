"""The shared-memory directory an engine plugin writes to: checked once when the plugin registers, and cleaned
of the directories of exited engines when each engine process exits. Engine-neutral (vLLM, SGLang).

Engines end their rank processes in ways that skip atexit (vLLM's forked workers exit through multiprocessing,
SGLang kills its schedulers), so no rank can be relied on to remove its engine's directory. Every process of
the engine's tree therefore removes, when it exits, the engine directories whose ranks are all gone (liveness
locks free; gatherwise/shm_format/liveness.py); the last process to exit (the engine's own process) finds
every rank gone. An engine killed outright is cleaned by the next engine start or by the sidecar.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.util

from gatherwise.config import GatherwiseConfig

log = logging.getLogger("gatherwise.adapters")


def shm_dir_problem(config: GatherwiseConfig) -> str | None:
    """Why the configured shm_dir cannot take the engine's files (None when it can, or nothing is written).
    Decided once, when the plugin registers, before any rank exists: never a failure in one rank's first step."""
    if not (config.telemetry.enabled or config.control.enabled):
        return None
    from gatherwise.shm_format.private_files import ensure_private_dir

    try:
        ensure_private_dir(config.engine.shm_dir)
    except OSError as exc:
        return f"engine.shm_dir is unusable ({exc})"
    return None


def clean_at_exit(shm_dir: str) -> None:
    """Remove the directories of engines whose ranks are all gone when this process exits: at interpreter exit,
    and at multiprocessing's exit of a worker (which skips atexit)."""
    atexit.register(remove_dead_dirs, shm_dir)
    multiprocessing.util.Finalize(None, remove_dead_dirs, args=(shm_dir,), exitpriority=0)


def remove_dead_dirs(shm_dir: str) -> None:
    from gatherwise.shm_format.liveness import remove_dead_engine_dirs

    try:
        removed = remove_dead_engine_dirs(shm_dir)
    except Exception as exc:
        log.debug("gatherwise: cleanup of %s failed: %s", shm_dir, exc)
        return
    if removed:
        log.info("gatherwise: removed the shared-memory directories of exited engines: %s", ", ".join(removed))
