"""Whether the engine that wrote a directory still runs, and removing the directories of engines that do not.

Every rank holds an exclusive flock on its own `<engine dir>/alive-<rank>` for as long as its process lives.
Why a lock and not the writer's pid: the kernel drops the lock when the process ends, however it ends (SIGKILL,
a vLLM worker force-killed at shutdown, a forked worker that never runs atexit), a pid can be reused by an
unrelated process, and a lock means the same thing across PID namespaces (a sidecar in another container sees
other pids, or none). The lock file is built under a temporary name and locked before it is renamed into place,
so nobody ever sees an unlocked `alive-<rank>` of a running rank. Stdlib only.
"""

from __future__ import annotations

import enum
import fcntl
import os
import shutil
import time

from gatherwise.shm_format.private_files import create_private_file, open_regular_file, temporary_name
from gatherwise.shm_format.ring import ENGINE_ID_HEX_DIGITS

ALIVE_PREFIX = "alive-"
# A directory with no files at all is one an engine is creating right now, or garbage: garbage after this long.
EMPTY_DIR_GRACE_S = 60.0


class Liveness(enum.Enum):
    ALIVE = "alive"  # at least one rank holds its lock
    DEAD = "dead"  # lock files exist and nobody holds any of them
    UNKNOWN = "unknown"  # no lock files (written by a version without them, or by a test's bare recorder)


class LivenessLock:
    """Held by one rank for its lifetime; close() (or the process ending) releases it."""

    def __init__(self, engine_dir: str | os.PathLike[str], rank: int) -> None:
        self.path = os.path.join(os.fspath(engine_dir), f"{ALIVE_PREFIX}{rank}")
        tmp = temporary_name(self.path)
        fd = create_private_file(tmp)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a brand-new file: nobody else can hold it
            os.replace(tmp, self.path)
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def is_engine_dir_name(name: str) -> bool:
    """`<shm_dir>/<engine id as 16 lowercase hex digits>` (ring.engine_dir_name)."""
    return len(name) == ENGINE_ID_HEX_DIGITS and all(c in "0123456789abcdef" for c in name)


def liveness(directory: str | os.PathLike[str]) -> Liveness:
    """Probe every `alive-*` file with a non-blocking shared lock (released at once)."""
    directory = os.fspath(directory)
    locks = [n for n in os.listdir(directory) if n.startswith(ALIVE_PREFIX) and n[len(ALIVE_PREFIX):].isdigit()]
    if not locks:
        return Liveness.UNKNOWN
    for name in locks:
        try:
            fd = open_regular_file(os.path.join(directory, name))
        except OSError:
            continue  # removed meanwhile, or not a file we made
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return Liveness.ALIVE
        finally:
            os.close(fd)  # also drops the shared lock if we got it
    return Liveness.DEAD


def is_removable(directory: str | os.PathLike[str], now: float | None = None) -> bool:
    """Dead by its locks, or empty for longer than EMPTY_DIR_GRACE_S; and a real directory owned by this user."""
    directory = os.fspath(directory)
    st = os.lstat(directory)
    if not os.path.isdir(directory) or os.path.islink(directory) or st.st_uid != os.geteuid():
        return False
    state = liveness(directory)
    if state is Liveness.DEAD:
        return True
    if state is Liveness.UNKNOWN and not os.listdir(directory):
        return (time.time() if now is None else now) - st.st_mtime > EMPTY_DIR_GRACE_S
    return False


def remove_dead_engine_dirs(shm_dir: str | os.PathLike[str], keep: frozenset[str] = frozenset()) -> list[str]:
    """Remove the engine directories under shm_dir whose engine is gone (see is_removable); names in `keep`
    stay. Returns the removed directory names. Never raises for one directory that cannot be handled."""
    removed: list[str] = []
    try:
        entries = list(os.scandir(shm_dir))
    except OSError:
        return removed
    for entry in entries:
        if entry.name in keep or not is_engine_dir_name(entry.name):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or not is_removable(entry.path):
                continue
            shutil.rmtree(entry.path)  # fd-based on Linux: never follows a symlink planted inside
            removed.append(entry.name)
        except OSError:
            continue
    return removed
