"""vLLM general plugin (entry point `vllm.general_plugins: gatherwise`): puts the hooks into every vLLM worker.

vLLM calls register() in every process it starts (API server, engine core, each worker), possibly more than
once; it does nothing unless `GATHERWISE_ENABLE=1`. The configuration is engine_hooks.config's: the YAML file
named by `GATHERWISE_CONFIG` plus `GATHERWISE_<SECTION>_<KEY>` overrides, e.g. `GATHERWISE_ENGINE_SHM_DIR`
for where the rings and the control block go (the sidecar must read the same directory).

register() only wraps three vLLM functions (see vllm_patches); the hooks themselves are installed lazily, in
each worker, at its first step (see vllm_step).

Two things vLLM does not do for us:
- Logging: vLLM configures only its own `vllm` logger, so gatherwise's lines would go nowhere; register() gives
  the `gatherwise` logger a handler in vLLM's format (unless the application configured logging itself), so
  "gatherwise: vLLM plugin active" and each worker's "hooks installed" appear in vLLM's log.
- Cleanup: vLLM's workers are forked multiprocessing children that exit without running atexit, and vLLM kills
  the ones that do not exit in time. Every process of the tree therefore removes, when it exits, the engine
  directories in shm_dir whose ranks are all gone (liveness locks free; engine_hooks/shm_format/liveness.py);
  the last process to exit (the API server or the LLM's process) finds every rank gone and removes the
  directory. An engine killed outright is cleaned by the next engine start or by the sidecar.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.util
import os
import sys

from engine_hooks.adapters.enable import enabled

log = logging.getLogger("gatherwise.vllm")

_registered = False


def register() -> None:
    """Idempotent. Leaves vLLM untouched (one warning) when the installed vLLM is not one the adapter knows."""
    global _registered
    if _registered:
        return
    _registered = True
    if not enabled():
        return
    from engine_hooks.adapters import vllm_patches

    problems = vllm_patches.compatibility_problems()
    if problems:
        log.warning("gatherwise: %s; the vLLM plugin leaves vLLM untouched (hooks off, logits path unchanged)",
                    "; ".join(problems))
        return
    from engine_hooks.adapters.vllm_step import VllmStepHooks
    from engine_hooks.config import load_config

    config = load_config(os.environ.get("GATHERWISE_CONFIG"))  # a broken config fails loudly: hooks were asked for
    attach_log_handler()
    if config.telemetry.enabled or config.control.enabled:
        from engine_hooks.shm_format.private_files import ensure_private_dir

        try:  # decided here, once, before any worker exists: never a failure in one rank's first step
            ensure_private_dir(config.engine.shm_dir)
        except OSError as exc:
            log.warning("gatherwise: engine.shm_dir is unusable (%s); the vLLM plugin leaves vLLM untouched (hooks "
                        "off, logits path unchanged)", exc)
            return
    vllm_patches.apply(VllmStepHooks(config))
    clean_at_exit(config.engine.shm_dir)
    log.info("gatherwise: vLLM plugin active in process %d (shm_dir %s, initial mode %s)", os.getpid(),
             config.engine.shm_dir, config.engine.initial_table_file or config.engine.initial_mode)


def attach_log_handler() -> None:
    """INFO and above of the `gatherwise` logger to stderr in vLLM's line format, unless logging is configured
    (a handler on `gatherwise` or on the root logger): then the application decides."""
    root = logging.getLogger("gatherwise")
    if root.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("(%(processName)s pid=%(process)d) %(levelname)s %(asctime)s "
                                           "[%(name)s] %(message)s", datefmt="%m-%d %H:%M:%S"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    root.propagate = False  # one line per record even if someone configures the root logger later


def clean_at_exit(shm_dir: str) -> None:
    """Remove the directories of engines whose ranks are all gone when this process exits: at interpreter exit,
    and at multiprocessing's exit of a worker (which skips atexit)."""
    atexit.register(remove_dead_dirs, shm_dir)
    multiprocessing.util.Finalize(None, remove_dead_dirs, args=(shm_dir,), exitpriority=0)


def remove_dead_dirs(shm_dir: str) -> None:
    from engine_hooks.shm_format.liveness import remove_dead_engine_dirs

    try:
        removed = remove_dead_engine_dirs(shm_dir)
    except Exception as exc:  # noqa: BLE001 - never fail a process's exit over cleanup
        log.debug("gatherwise: cleanup of %s failed: %s", shm_dir, exc)
        return
    if removed:
        log.info("gatherwise: removed the shared-memory directories of exited engines: %s", ", ".join(removed))
