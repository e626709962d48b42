"""The one switch every engine adapter honours: hooks stay off unless GATHERWISE_ENABLE is set.

Installing gatherwise into an engine's environment registers its plugin with the engine; the plugin does
nothing until the operator asks for it, so an installed but unused gatherwise never changes an engine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

ENABLE_ENV = "GATHERWISE_ENABLE"


def enabled(env: Mapping[str, str] = os.environ) -> bool:
    return env.get(ENABLE_ENV, "").strip().lower() in ("1", "true", "yes", "on")
