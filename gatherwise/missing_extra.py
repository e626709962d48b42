"""Which optional extra of the `gatherwise` distribution provides a module that failed to import, read from the
installed metadata (the extras are declared once, in pyproject.toml's [project.optional-dependencies]).
"""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, distribution

DISTRIBUTION = "gatherwise"


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _provides(requirement: str, module: str) -> bool:
    """`opentelemetry-sdk` provides `opentelemetry`, `prometheus_client` provides itself, `pyyaml` provides `yaml`."""
    name = _normalized(requirement)
    return name in (module, "py" + module) or name.startswith(module + "_")


def extra_providing(module: str) -> str | None:
    """The extra whose requirements provide the top-level `module`, or None (not an extra's, or not installed)."""
    top = _normalized(module.split(".", 1)[0])
    try:
        requires = distribution(DISTRIBUTION).requires or []
    except PackageNotFoundError:
        return None
    for line in requires:
        marker = re.search(r"""extra\s*==\s*["']([\w-]+)["']""", line)
        requirement = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line)
        if marker and requirement and _provides(requirement.group(0), top):
            return marker.group(1)
    return None
