"""A daemon thread that runs one step every interval until stopped (the ingest loop, the control loop)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable


class PeriodicThread:
    def __init__(self, name: str, step: Callable[[], object], interval: float, log: logging.Logger) -> None:
        self.name, self.step, self.interval, self.log = name, step, interval, log
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.step()
            except Exception:  # one bad step (a ring or block vanishing mid-read) must not end the loop
                self.log.exception("%s step failed", self.name)
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - t0)))
