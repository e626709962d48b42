"""SGLang general plugin (entry point `sglang.srt.plugins: gatherwise`): puts the hooks into every SGLang process.

SGLang 0.5.23 loads the general plugins of its `sglang.srt.plugins` entry-point group at the start of every
process it runs (engine, each TP scheduler, detokenizer), then applies the hooks they registered with its hook
registry. register() does nothing unless `GATHERWISE_ENABLE=1` (and `SGLANG_PLUGINS`, when set, must name
`gatherwise`). The configuration is gatherwise.config's: the YAML file named by `GATHERWISE_CONFIG` plus
`GATHERWISE_<SECTION>_<KEY>` overrides, e.g. `GATHERWISE_ENGINE_SHM_DIR` for where the rings and the control
block go (the sidecar must read the same directory).

register() only registers wrappers (see sglang.patches); the hooks themselves are installed lazily, in each TP
scheduler process, at its first step (see sglang.step).
"""

from __future__ import annotations

import logging

from gatherwise.engine_hooks.adapters.plugin import EnginePlugin

PLUGIN = EnginePlugin("SGLang", "sglang", "gatherwise.engine_hooks.adapters.sglang.patches",
                      logging.getLogger("gatherwise.sglang"))
register = PLUGIN.register  # the entry point; leaves SGLang untouched (one warning) when its code is not verified
