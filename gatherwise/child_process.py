"""Child processes that cannot outlive the process that started them (the local stack, the demo, bench serve, tests).

Two things make a child die with its parent however the parent ends: the parent-death signal (Linux: the kernel
sends SIGTERM to the child when the thread that forked it exits, even by SIGKILL), and a session of its own, so a
terminal's Ctrl-C reaches only the parent, which then stops its children in order (sidecar before engine) rather
than every process at once. A shell that starts a job in the background starts it with SIGINT ignored; children
inherit that, so every gatherwise process installs its own signal handlers instead of relying on Python's default.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
from typing import Any

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec_fn: SIGTERM this child when its parent dies (no-op where prctl does not exist)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def start_child(args: list[str], **kwargs: Any) -> subprocess.Popen:
    """subprocess.Popen in its own session, with the parent-death signal set."""
    return subprocess.Popen(args, start_new_session=True, preexec_fn=die_with_parent, **kwargs)


def stop_child(process: subprocess.Popen, timeout: float) -> int:
    """SIGTERM, then SIGKILL when it has not exited within `timeout` seconds; returns its exit status."""
    if process.poll() is None:
        process.terminate()
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()
