"""vLLM general plugin (entry point `vllm.general_plugins: gatherwise`): puts the hooks into every vLLM worker.

vLLM calls register() in every process it starts (API server, engine core, each worker), possibly more than
once; it does nothing unless `GATHERWISE_ENABLE=1`. The configuration is engine_hooks.config's: the YAML file
named by `GATHERWISE_CONFIG` plus `GATHERWISE_<SECTION>_<KEY>` overrides, e.g. `GATHERWISE_ENGINE_SHM_DIR`
for where the rings and the control block go (the sidecar must read the same directory).

register() only wraps three vLLM functions (see vllm_patches); the hooks themselves are installed lazily, in
each worker, at its first step (see vllm_step).
"""

from __future__ import annotations

import logging
import os

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
    vllm_patches.apply(VllmStepHooks(config))
    log.info("gatherwise: vLLM plugin active (shm_dir %s, initial mode %s)", config.engine.shm_dir,
             config.engine.initial_table_file or config.engine.initial_mode)
