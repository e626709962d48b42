"""A real `gatherwise sidecar` subprocess for the benchmarks that drive or measure it: on a free port of 127.0.0.1,
with a known API token, reading the config file the benchmark wrote."""

from __future__ import annotations

import os
import re
import subprocess
import sys

TOKEN = "gatherwise-bench"  # the benchmarks' API token (mutations need one)


def auth_header() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


def start_sidecar(config: str, source: str | None = None) -> tuple[subprocess.Popen, str]:
    """`gatherwise sidecar` of this checkout, or of the source tree at `source` (a baseline build): (the process,
    its URL) once it listens; stderr is dropped, stdout stays a pipe."""
    env = {**os.environ, "GATHERWISE_API_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1"}
    if source is not None:  # `python -m` puts its working directory first on sys.path: run it from there
        env["PYTHONPATH"] = source
    proc = subprocess.Popen([sys.executable, "-m", "gatherwise.cli", "sidecar", "--port", "0", "--config", config],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=source)
    assert proc.stdout is not None  # piped above
    line = proc.stdout.readline()
    found = re.search(r"(http://127\.0\.0\.1:\d+)", line)
    if found is None:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the sidecar did not start (its first line: {line!r})")
    return proc, found.group(1)
