"""The doctor's shared-memory part: the directory the engine's ranks would write their rings to (the config's
`engine.shm_dir`, as the plugin loads it), and the size and free space of its filesystem."""

from __future__ import annotations

import os
from pathlib import Path

from gatherwise.config import ConfigError, load_config
from gatherwise.engine_hooks.doctor.section import Section

GIB = 1 << 30


def shm_section() -> Section:
    section = Section("shared memory")
    try:
        config = load_config()
    except ConfigError as exc:
        section.refuse(f"the gatherwise config does not load: {exc}")
        return section
    path = Path(config.engine.shm_dir)
    existing = next(p for p in (path, *path.parents) if p.exists())
    stat = os.statvfs(existing)
    size, free = stat.f_blocks * stat.f_frsize, stat.f_bavail * stat.f_frsize
    state = "exists" if existing == path else f"does not exist yet (created under {existing} at the engine's start)"
    section.add(f"engine.shm_dir {path}: {state}")
    section.add(f"its filesystem: {size / GIB:.1f} GiB, {free / GIB:.1f} GiB free")
    if not os.access(existing, os.W_OK | os.X_OK):
        section.refuse(f"{existing} is not writable by this user")
    return section
