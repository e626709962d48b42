"""`gatherwise generate` in the tests of its command line: run as a user runs it (a subprocess, JSON out), or
refusing arguments the way argparse does (exit status 2, the reason on stderr)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CLI_TIMEOUT_S = 240


def generate_json(*args: str) -> dict:
    cmd = [sys.executable, "-m", "gatherwise.cli", "generate", *args, "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def assert_refused(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`gatherwise generate ARGV` exits 2 before running anything and says `message` on stderr."""
    from gatherwise.tp_engine.generate_cli import generate_main

    with pytest.raises(SystemExit) as info:
        generate_main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err
