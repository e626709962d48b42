"""`gatherwise demo` started the way CI and scripts start it — in the background of a non-interactive shell,
which starts it with SIGINT ignored — stops cleanly on SIGINT and SIGTERM with exit status 0, leaving no process
and no shared-memory directory; killed outright, every process it started still dies with it."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests._processes import descendants, processes_mentioning
from tests._sidecar import ROOT, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def start_demo_in_background(log: Path, *extra: str) -> tuple[subprocess.Popen, int]:
    """`sh -c 'demo & wait'`: returns the shell and the demo's pid. The shell's exit status is the demo's. The demo's
    work directory goes beside the log (TMPDIR), so a demo the test kills leaves it to pytest's tmp_path."""
    command = f"grep SigIgn /proc/self/status > {log}.sigign & " \
              f"{sys.executable} -m gatherwise.cli demo --interval 1 {' '.join(extra)} > {log} 2>&1 & " \
              f"echo $!; wait $!"
    shell = subprocess.Popen(["bash", "-c", command], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(log.parent)},
                             start_new_session=True)
    assert shell.stdout is not None  # stdout=PIPE
    pid = int(shell.stdout.readline())
    return shell, pid


def ignored_signals(log: Path) -> int:
    """SigIgn of a sibling job of the demo, started by the same shell the same way."""
    path = Path(f"{log}.sigign")

    def mask() -> str | None:
        text = path.read_text() if path.exists() else ""
        return text if text.endswith("\n") else None

    return int(wait_for(mask, 10, "the sibling job's signal mask").split()[1], 16)


def wait_screen(log: Path) -> str:
    def screen() -> str | None:
        text = log.read_text(errors="replace") if log.exists() else ""  # the shell may not have opened it yet
        return text if "flip by hand" in text else None

    return wait_for(screen, 300, "the demo's first full screen")


def stack_dir_of(demo_pid: int) -> str:
    for pid in descendants(demo_pid):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--shm-dir" in args:
            return args[args.index(b"--shm-dir") + 1].decode()
    raise AssertionError("no child with --shm-dir")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_demo_from_a_non_interactive_shell_stops_on_request(tmp_path, sig):
    log = tmp_path / "demo.log"
    shell, pid = start_demo_in_background(log, "--no-prometheus")
    try:
        assert ignored_signals(log) & (1 << (signal.SIGINT - 1)), "precondition: the shell ignores SIGINT for jobs"
        wait_screen(log)
        stack = stack_dir_of(pid)
        os.kill(pid, sig)
        assert shell.wait(120) == 0, log.read_text()[-3000:]
        text = log.read_text()
        assert re.search(rf"shared-memory dir {re.escape(stack)} removed", text), text[-3000:]
        assert not os.path.exists(stack)
        assert processes_mentioning(stack) == []
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
            shell.wait(30)


def test_killed_demo_takes_every_child_with_it(tmp_path):
    log = tmp_path / "demo.log"
    shell, pid = start_demo_in_background(log)  # with Prometheus when it is installed
    stack = None
    try:
        wait_screen(log)
        stack = stack_dir_of(pid)
        children = descendants(pid)
        assert children
        os.kill(pid, signal.SIGKILL)
        shell.wait(30)
        wait_for(lambda: not [c for c in children if _alive(c)], 120, "every child of the killed demo to exit")
        if shutil.which("prometheus"):
            assert not [a for a in processes_mentioning(str(tmp_path)) if "prometheus" in a]
        # the engine removed its own directory; only the empty stack directory can remain after a SIGKILL
        wait_for(lambda: not os.path.exists(stack) or os.listdir(stack) == [], 60, "the engine's directory gone")
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
            shell.wait(30)
        for child in descendants(pid) if _alive(pid) else []:
            os.kill(child, signal.SIGKILL)
        if stack:
            shutil.rmtree(stack, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
