"""SGLang general plugin (entry point `sglang.srt.plugins: gatherwise`): puts the hooks into every SGLang process.

SGLang 0.5.23 loads the general plugins of its `sglang.srt.plugins` entry-point group at the start of every
process it runs (engine, each TP scheduler, detokenizer), then applies the hooks they registered with its hook
registry. register() does nothing unless `GATHERWISE_ENABLE=1` (and `SGLANG_PLUGINS`, when set, must name
`gatherwise`). The configuration is engine_hooks.config's: the YAML file named by `GATHERWISE_CONFIG` plus
`GATHERWISE_<SECTION>_<KEY>` overrides, e.g. `GATHERWISE_ENGINE_SHM_DIR` for where the rings and the control
block go (the sidecar must read the same directory).

register() only registers wrappers (see sglang_patches); the hooks themselves are installed lazily, in each TP
scheduler process, at its first step (see sglang_step).
"""

from __future__ import annotations

import logging
import os

from engine_hooks.adapters.enable import enabled
from engine_hooks.adapters.engine_dirs import clean_at_exit, shm_dir_problem

log = logging.getLogger("gatherwise.sglang")

_registered = False


def register() -> None:
    """Idempotent. Leaves SGLang untouched (one warning) when the installed SGLang is not one the adapter knows."""
    global _registered
    if _registered:
        return
    _registered = True
    if not enabled():
        return
    from engine_hooks.adapters import sglang_patches

    problems = sglang_patches.compatibility_problems()
    if problems:
        log.warning("gatherwise: %s; the SGLang plugin leaves SGLang untouched (hooks off, logits path unchanged)",
                    "; ".join(problems))
        return
    from engine_hooks.adapters.sglang_step import SglangStepHooks
    from engine_hooks.config import load_config

    config = load_config(os.environ.get("GATHERWISE_CONFIG"))  # a broken config fails loudly: hooks were asked for
    problem = shm_dir_problem(config)
    if problem:
        log.warning("gatherwise: %s; the SGLang plugin leaves SGLang untouched (hooks off, logits path unchanged)",
                    problem)
        return
    sglang_patches.register(SglangStepHooks(config))
    clean_at_exit(config.engine.shm_dir)  # SGLang kills its schedulers: the engine's own process cleans up
    log.info("gatherwise: SGLang plugin active in process %d (shm_dir %s, initial mode %s)", os.getpid(),
             config.engine.shm_dir, config.engine.initial_table_file or config.engine.initial_mode)
