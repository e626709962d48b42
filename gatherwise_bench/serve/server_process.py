"""An engine's OpenAI-compatible server as a child process: started in a session of its own (so its workers are
stopped with it), ready when it lists its model, stopped as Ctrl-C stops it, and nothing left in /dev/shm."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

from gatherwise.bench.serve.engine_spec import LOCAL_HOST
from gatherwise.child_process import start_child

READY_TIMEOUT_S = 900.0  # a TP=2 start on 2 shared cores, loading a 600 MB checkpoint twice
STOP_TIMEOUT_S = 120.0
LOG_TAIL_CHARS = 6000


def shm_files(patterns: tuple[str, ...]) -> set[str]:
    return {path for pattern in patterns for path in glob.glob(f"/dev/shm/{pattern}")}


class ServerProcess:
    def __init__(self, command: list[str], env: dict[str, str], port: int, log_path: Path,
                 shm_leftovers: tuple[str, ...]) -> None:
        self.host, self.port = LOCAL_HOST, port
        self.url = f"http://{LOCAL_HOST}:{port}"
        self.log_path = log_path
        self.shm_leftovers = shm_leftovers
        self._shm_before = shm_files(shm_leftovers)
        self._log = open(log_path, "w")
        self.started = time.monotonic()
        self.proc = start_child(command, env=env, stdout=self._log, stderr=subprocess.STDOUT, text=True)

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> float:
        """Seconds from start until the server lists its model (both engines answer /v1/models once they serve)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/v1/models", timeout=5).status_code == 200:
                    return time.monotonic() - self.started
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server was not ready within {timeout_s:.0f} s:\n{self.log_tail()}")
            time.sleep(1.0)

    def stop(self) -> int | None:
        """SIGINT (what Ctrl-C sends: both engines shut their workers down on it), then SIGKILL to the whole
        session; then the engine's own /dev/shm leftovers that were not there before it started."""
        code = self.proc.poll()
        if code is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                code = self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                code = None
        try:  # workers that outlived the server
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if code is None:
            self.proc.wait(30)
        self._log.close()
        time.sleep(0.5)  # killed workers' files
        for leftover in shm_files(self.shm_leftovers) - self._shm_before:
            try:
                os.unlink(leftover)
            except OSError:
                pass
        return code
