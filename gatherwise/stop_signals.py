"""SIGINT and SIGTERM as one exception, so a command that starts processes stops them in its `finally` blocks.

Set explicitly rather than relying on Python's default: a process started in the background by a non-interactive
shell inherits SIGINT ignored, and the default SIGTERM ends the process without running any `finally`."""

from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequested(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived."""


def _request_stop(signum: int, _frame: object) -> None:
    raise StopRequested(signal.Signals(signum).name)


def raise_on_stop_signals() -> None:
    """From now on SIGINT and SIGTERM raise StopRequested in the main thread."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _request_stop)


def ignore_stop_signals() -> None:
    """While cleaning up: a second Ctrl-C must not cut the cleanup short."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
