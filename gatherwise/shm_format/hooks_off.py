"""Hooks-off notices: how an engine process whose gatherwise hooks refused or never engaged tells the sidecar.

An engine whose hooks are off has no rings and no control block, so without a word of its own it would be
invisible: the operator would see "no engine" and never learn that the plugin is installed, enabled, and off.
Such a process writes one small JSON file, `<shm_dir>/hooks-off-<pid>-<random>.json`, per reason, and holds an
exclusive flock on it for as long as it lives (the kernel drops the lock however the process ends, as for the
engine directories' liveness locks). The sidecar lists the notices whose lock is held and removes the others.

Fields (format 1): engine ("vLLM", "SGLang"), reason (one of REASONS), detail (the warning's text), pid, tp_rank
(null where the process is no TP rank, or not yet one), created_ns (wall clock). A notice is at most
MAX_NOTICE_BYTES; the reader refuses anything larger, not a regular file, or not one of ours. Stdlib only.
"""

from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass

from gatherwise.shm_format.json_record import is_u63, parse_record, record_json
from gatherwise.shm_format.private_files import (
    create_private_file,
    ensure_private_dir,
    open_regular_file,
    temporary_name,
)

FORMAT = 1
PREFIX = "hooks-off-"
SUFFIX = ".json"
MAX_NOTICE_BYTES = 4096
MAX_NOTICES = 256  # the sidecar reads at most this many per scan (a littered directory costs bounded time)
MAX_DETAIL_CHARS = 1000
ENGINES = ("vLLM", "SGLang")
# Why the hooks are off; the sidecar's `reason` label takes these values (anything else reads as "other").
REASONS = (
    "unsupported_version",  # the engine's code matches no release the adapter was verified against
    "unsupported_feature",  # speculative decoding, pipeline parallelism, DP attention, ...
    "single_rank",  # TP=1: the engine makes no logits collective
    "logits_shape",  # a logits shard the path cannot take
    "unhooked_logits_calls",  # the engine's logits collective ran outside every hooked step
    "never_engaged",  # a step computed its logits without going through the hooked collective
)


@dataclass(frozen=True)
class HooksOffNotice:
    engine: str
    reason: str
    detail: str
    pid: int
    tp_rank: int | None
    created_ns: int

    def to_json(self) -> bytes:
        return record_json(self, FORMAT)

    @classmethod
    def from_json(cls, data: bytes) -> HooksOffNotice:
        """Parse a notice; ValueError for anything that is not one."""
        obj = parse_record(data, FORMAT, "hooks-off notice")
        engine, reason, detail = obj.get("engine"), obj.get("reason"), obj.get("detail")
        pid, rank, created = obj.get("pid"), obj.get("tp_rank"), obj.get("created_ns")
        if engine not in ENGINES or not isinstance(reason, str) or not isinstance(detail, str):
            raise ValueError("engine, reason or detail missing or of the wrong type")
        if not is_u63(pid) or not is_u63(created) or not (rank is None or is_u63(rank)):
            raise ValueError("pid, tp_rank or created_ns of the wrong type")
        return cls(engine, reason if reason in REASONS else "other", detail[:MAX_DETAIL_CHARS], pid, rank, created)




def is_notice_name(name: str) -> bool:
    return name.startswith(PREFIX) and name.endswith(SUFFIX)


class NoticeWriter:
    """Publishes this process's notices; each stays locked (alive) until the process ends."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, str], int] = {}  # (shm_dir, reason) -> the locked file's descriptor

    def publish(self, shm_dir: str | os.PathLike[str], engine: str, reason: str, detail: str,
                tp_rank: int | None = None) -> str | None:
        """Write the notice unless this process already published one for this reason in this directory.
        Returns the file's path, or None when it was published before. OSError when it cannot be written."""
        key = (os.fspath(shm_dir), reason)
        if key in self._held:
            return None
        ensure_private_dir(shm_dir)
        notice = HooksOffNotice(engine, reason, detail[:MAX_DETAIL_CHARS], os.getpid(), tp_rank, time.time_ns())
        path = os.path.join(os.fspath(shm_dir), f"{PREFIX}{os.getpid()}-{os.urandom(4).hex()}{SUFFIX}")
        tmp = temporary_name(path)
        fd = create_private_file(tmp)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a brand-new file: nobody else can hold it
            view = memoryview(notice.to_json())
            while view:
                view = view[os.write(fd, view):]
            os.replace(tmp, path)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        self._held[key] = fd
        return path


def read_notices(shm_dir: str | os.PathLike[str], remove_dead: bool = True) -> list[HooksOffNotice]:
    """The notices of live processes in shm_dir, oldest first; dead ones (lock free) are removed when asked.
    Unreadable or foreign files are skipped. Never raises for one file."""
    try:
        names = sorted(e.name for e in os.scandir(shm_dir) if is_notice_name(e.name))[:MAX_NOTICES]
    except OSError:
        return []
    found = []
    for name in names:
        path = os.path.join(os.fspath(shm_dir), name)
        try:
            fd = open_regular_file(path, owner_of_dir=True)  # a notice of shm_dir's user (or this one's)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                pass  # its process holds it: alive
            else:
                if remove_dead:
                    _remove(path)
                continue
            data = os.read(fd, MAX_NOTICE_BYTES + 1)
            if len(data) > MAX_NOTICE_BYTES:
                continue
            found.append(HooksOffNotice.from_json(data))
        except (OSError, ValueError):
            continue
        finally:
            os.close(fd)
    return sorted(found, key=lambda n: n.created_ns)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
