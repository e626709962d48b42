"""`gatherwise generate ... --json` run as a user runs it (a subprocess), for the tests of the command line."""

from __future__ import annotations

import json
import subprocess
import sys

CLI_TIMEOUT_S = 240


def generate_json(*args: str) -> dict:
    cmd = [sys.executable, "-m", "gatherwise.cli", "generate", *args, "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
