"""SIGINT and SIGTERM reach a command's `finally` blocks (gatherwise/stop_signals.py), also when the command was
started in the background by a non-interactive shell, which hands it SIGINT ignored."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

CHILD = """
import os, signal, sys, time
from gatherwise.stop_signals import StopRequested, raise_on_stop_signals
raise_on_stop_signals()
try:
    print("ready", flush=True)
    time.sleep(60)
except StopRequested as stop:
    print(f"stopped by {stop}", flush=True)
finally:
    print("cleaned up", flush=True)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_runs_the_cleanup_even_when_the_shell_ignored_sigint(sig):
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=30)
    assert out == f"stopped by {sig.name}\ncleaned up\n"
