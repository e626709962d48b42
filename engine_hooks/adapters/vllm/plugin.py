"""vLLM general plugin (entry point `vllm.general_plugins: gatherwise`): puts the hooks into every vLLM worker.

vLLM calls register() in every process it starts (API server, engine core, each worker), possibly more than
once; it does nothing unless `GATHERWISE_ENABLE=1`. The configuration is gatherwise.config's: the YAML file
named by `GATHERWISE_CONFIG` plus `GATHERWISE_<SECTION>_<KEY>` overrides, e.g. `GATHERWISE_ENGINE_SHM_DIR`
for where the rings and the control block go (the sidecar must read the same directory).

register() only wraps three vLLM functions (see vllm.patches); the hooks themselves are installed lazily, in
each worker, at its first step (see vllm.v1_step and vllm.v2_step).

Two things vLLM does not do for us:
- Logging: vLLM configures only its own `vllm` logger, so gatherwise's lines would go nowhere; register() gives
  the `gatherwise` logger a handler in vLLM's format (unless the application configured logging itself), so
  "gatherwise: vLLM plugin active" and each worker's "hooks installed" appear in vLLM's log.
- Cleanup: vLLM's workers are forked multiprocessing children that exit without running atexit, and vLLM kills
  the ones that do not exit in time; every process of the tree removes the directories of exited engines when
  it exits (gatherwise.engine_hooks.adapters.engine_dirs).
"""

from __future__ import annotations

import logging
import sys

from gatherwise.engine_hooks.adapters.plugin import EnginePlugin

log = logging.getLogger("gatherwise.vllm")


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


PLUGIN = EnginePlugin("vLLM", "vllm", "gatherwise.engine_hooks.adapters.vllm.patches", log, attach_log_handler)
register = PLUGIN.register  # the entry point; leaves vLLM untouched (one warning) when its code is not verified
