"""Helpers for tests that run the real `gatherwise engine` and `gatherwise sidecar` processes."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests._repo import ROOT

GATHERWISE = [sys.executable, "-m", "gatherwise.cli"]
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


@dataclass
class Proc:
    popen: subprocess.Popen
    lines: queue.Queue  # stdout lines as they come
    output: list[str]

    def wait_line(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.popen.poll() is not None and self.lines.empty():
                    break
                continue
            if m := re.search(pattern, line):
                return m
        raise AssertionError(f"no line matching {pattern!r} within {timeout}s; output:\n{''.join(self.output)}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(5)
            raise AssertionError(f"process did not exit within {timeout}s of signal {sig}") from None


def spawn(args: list[str], env_extra: dict[str, str] | None = None, user: tuple[int, int] | None = None) -> Proc:
    """`gatherwise ARGS`, its output pumped into a queue; `user`: (uid, gid) to run it as (the caller is root)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    uid, gid = user if user else (None, None)
    popen = subprocess.Popen([*GATHERWISE, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, user=uid, group=gid,
                             extra_groups=[] if user else None)
    stdout = popen.stdout
    assert stdout is not None  # stdout=PIPE
    lines: queue.Queue = queue.Queue()
    output: list[str] = []

    def pump() -> None:
        for line in stdout:
            output.append(line)
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return Proc(popen, lines, output)


def start_sidecar(shm_dir: str, *, config: str | None = None, env_extra: dict[str, str] | None = None
                  ) -> tuple[Proc, str]:
    args = ["sidecar", "--port", "0", "--shm-dir", str(shm_dir)] + (["--config", config] if config else [])
    proc = spawn(args, env_extra)
    try:
        url = proc.wait_line(r"listening on (http://127\.0\.0\.1:\d+)", 60).group(1)
    except BaseException:  # a sidecar that never said where it listens is stopped, not left behind
        proc.stop()
        raise
    return proc, url


def start_engine(shm_dir: str, *, tp: int = 2, duration: float, workload: str = "mixed",
                 config: str | None = None, user: tuple[int, int] | None = None,
                 env_extra: dict[str, str] | None = None) -> Proc:
    args = ["engine", "--tp", str(tp), "--duration", str(duration), "--workload", workload, "--shm-dir",
            str(shm_dir)] + (["--config", config] if config else [])
    return spawn(args, env_extra, user)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (httpx.HTTPError, ValueError, KeyError):
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def scrape(url: str, accept: str | None = None) -> str:
    headers = {"Accept": accept} if accept else {}
    return httpx.get(f"{url}/metrics", headers=headers, timeout=10).text


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


def total(text: str, name: str, **labels: str) -> float:
    return sum(v for n, lab, v in samples(text) if n == name and all(lab.get(k) == x for k, x in labels.items()))
