"""What the tests learn about processes from /proc: the tree below a process, who mentions a path, memory."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, their children, ...), from /proc."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(popen: subprocess.Popen) -> None:
    """SIGKILL a process and everything below it at once: how an OOM kill or `kill -9` of a job ends an engine."""
    for pid in [popen.pid, *descendants(popen.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    popen.wait(30)


def processes_mentioning(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args:
            found.append(args)
    return found


def vm_kib(pid: int, field: str) -> int:
    """VmRSS / VmHWM of a process, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)
