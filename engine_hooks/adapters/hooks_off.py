"""Saying that the hooks are off in this engine process: once per reason, by name, in the engine's log and to
the sidecar (a hooks-off notice, gatherwise/shm_format/hooks_off.py), so an operator sees it without reading
engine logs. Engine-neutral (vLLM, SGLang); decided identically on every rank, so no rank waits alone.
"""

from __future__ import annotations

import logging

from gatherwise.config import GatherwiseConfig
from gatherwise.shm_format.hooks_off import NoticeWriter

_writer = NoticeWriter()
_said: set[str] = set()  # reasons already reported by this process


def report_hooks_off(log: logging.Logger, engine: str, reason: str, message: str,
                     config: GatherwiseConfig | None = None, tp_rank: int | None = None) -> bool:
    """Log ONE warning `gatherwise: <message>` for this reason, and publish the notice into the configured
    shm_dir (unless telemetry and control are both off: then no sidecar reads it). Returns False when this
    process had said it already."""
    if reason in _said:
        return False
    _said.add(reason)
    # every rank decides alike: rank 0 (or a process that is no rank) warns, the others only note it
    log.log(logging.WARNING if tp_rank in (None, 0) else logging.INFO, "gatherwise: %s", message)
    if config is not None and (config.telemetry.enabled or config.control.enabled):
        try:
            _writer.publish(config.engine.shm_dir, engine, reason, message, tp_rank)
        except OSError as exc:
            log.warning("gatherwise: cannot tell the sidecar that the hooks are off (%s)", exc)
    return True
