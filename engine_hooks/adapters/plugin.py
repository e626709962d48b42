"""What every engine plugin's register() does, once: stay off unless enabled, refuse with one warning what the
adapter does not know (engine version, unusable shm_dir), else install the hooks and clean up at exit.

A broken gatherwise config fails loudly instead: the operator asked for the hooks.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from engine_hooks.adapters.enable import enabled
from engine_hooks.adapters.engine_dirs import clean_at_exit, shm_dir_problem


def register_plugin(engine: str, log: logging.Logger, compatibility_problems: Callable[[], list[str]],
                    install: Callable[[object], None], prepare_logging: Callable[[], None] = lambda: None) -> bool:
    """Returns True when the hooks were installed. `install(config)` applies the engine's patches."""
    if not enabled():
        return False
    prepare_logging()
    untouched = f"the {engine} plugin leaves {engine} untouched (hooks off, logits path unchanged)"
    problems = compatibility_problems()
    if problems:
        log.warning("gatherwise: %s; %s", "; ".join(problems), untouched)
        return False
    from gatherwise.config import load_config

    config = load_config(os.environ.get("GATHERWISE_CONFIG"))
    problem = shm_dir_problem(config)
    if problem:
        log.warning("gatherwise: %s; %s", problem, untouched)
        return False
    install(config)
    clean_at_exit(config.engine.shm_dir)  # engines kill their workers: every process of the tree cleans up
    log.info("gatherwise: %s plugin active in process %d (shm_dir %s, initial mode %s)", engine, os.getpid(),
             config.engine.shm_dir, config.engine.initial_table_file or config.engine.initial_mode)
    return True
