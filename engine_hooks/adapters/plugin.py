"""What every engine plugin's register() does, once: stay off unless enabled, refuse with one warning what the
adapter does not know (an engine whose code matches no verified release, an unusable shm_dir), else install the
hooks and clean up at exit.

A broken gatherwise config fails loudly instead: the operator asked for the hooks. A refusal is also published
to the sidecar as a hooks-off notice (gatherwise.engine_hooks.adapters.hooks_off).

Each engine's patches module provides the same three things: `compatibility_problems(check)` (empty when the
targets of the runners the install has are of the shape the adapter wraps), `install(config, check)` (wrap the
engine around that engine's step hooks) and `applied()`; `check` is the engine's fingerprint check
(gatherwise.engine_hooks.adapters.engagement), which the workers consult again once their runner is known.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable

from gatherwise.engine_hooks.adapters.enable import enabled
from gatherwise.engine_hooks.adapters.engine_dirs import clean_at_exit, shm_dir_problem
from gatherwise.engine_hooks.adapters.hooks_off import report_hooks_off


class EnginePlugin:
    """One engine's plugin entry point. Engines call register() in every process they start, possibly more than
    once: it acts the first time only."""

    def __init__(self, engine: str, package: str, patches: str, log: logging.Logger,
                 prepare_logging: Callable[[], None] = lambda: None) -> None:
        self.engine, self.package, self.patches, self.log = engine, package, patches, log
        self.prepare_logging = prepare_logging
        self.registered = False

    def register(self) -> bool:
        """Returns True when the hooks were installed (by this call)."""
        if self.registered:
            return False
        self.registered = True
        if not enabled():
            return False
        self.prepare_logging()
        untouched = f"the {self.engine} plugin leaves {self.engine} untouched (hooks off, logits path unchanged)"
        from gatherwise.config import load_config

        config = load_config(os.environ.get("GATHERWISE_CONFIG"))
        problem = shm_dir_problem(config)
        if problem:  # nowhere to write: the engine's log is the only place to say it
            self.log.warning("gatherwise: %s; %s", problem, untouched)
            return False
        from gatherwise.engine_hooks.adapters.engagement import check_engine, install_refusal

        check = check_engine(self.package)
        refusal = install_refusal(check, self.engine)
        patches = importlib.import_module(self.patches)
        problems = [refusal] if refusal else patches.compatibility_problems(check)
        if problems:
            report_hooks_off(self.log, self.engine, "unsupported_version", f"{'; '.join(problems)}; {untouched}",
                             config)
            return False
        patches.install(config, check)
        clean_at_exit(config.engine.shm_dir)  # engines kill their workers: every process of the tree cleans up
        self.log.info("gatherwise: %s plugin active in process %d (shm_dir %s, initial mode %s)", self.engine,
                      os.getpid(), config.engine.shm_dir,
                      config.engine.initial_table_file or config.engine.initial_mode)
        return True
