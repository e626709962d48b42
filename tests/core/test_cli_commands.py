"""The `gatherwise` dispatcher: it finds each floor's commands by entry point (installed, or from the dist-info
scripts/package_tree.py writes for a checkout), shows their help without importing them, and names the extra a
command is missing."""

from __future__ import annotations

import subprocess
import sys

from gatherwise import commands
from tests._repo import ROOT

COMMANDS = {"bench", "demo", "doctor", "engine", "generate", "mode", "models", "sidecar"}


def test_every_command_is_found_and_its_function_exists():
    found = commands.commands()
    assert set(found) == COMMANDS
    for command in found.values():
        assert callable(command.load()), command


def test_a_plain_checkout_finds_the_same_commands_through_the_package_tree(tmp_path):
    """scripts/package_tree.py's layout alone on the path (no site-packages): its dist-info names every command."""
    subprocess.run([sys.executable, str(ROOT / "scripts" / "package_tree.py"), str(tmp_path)], check=True,
                   capture_output=True, timeout=60)
    code = "from gatherwise import commands; print(sorted((c.name, c.module, c.function) " \
           "for c in commands.commands().values()))"
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(tmp_path)}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(sorted((c.name, c.module, c.function) for c in commands.commands().values()))


def test_help_lists_every_command_without_importing_torch_or_the_web_stack():
    code = ("import sys; from gatherwise.cli import main; rc = main(['--help']); "
            "heavy = sorted(m for m in ('torch', 'fastapi', 'uvicorn', 'opentelemetry') if m in sys.modules); "
            "print(rc, heavy)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.stdout.strip() == "0 []", proc.stdout + proc.stderr
    listed = {line.split()[0] for line in proc.stderr.split("commands:\n", 1)[1].splitlines() if line.strip()}
    assert listed == COMMANDS
    assert "serve the sidecar with uvicorn." in proc.stderr  # the first line of its docstring


def test_an_unknown_command_prints_the_usage_and_exits_2(capsys):
    from gatherwise.cli import main

    assert main(["nope"]) == 2
    assert "usage: gatherwise COMMAND" in capsys.readouterr().err


def test_a_missing_extra_is_one_line_naming_it_and_exit_2():
    # fastapi made unimportable, as in an engine-side install without the `sidecar` extra
    code = "import sys; sys.modules['fastapi'] = None; from gatherwise.cli import main; sys.exit(main(['sidecar']))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'gatherwise[sidecar]'" in lines[0] and "fastapi" in lines[0], lines


def test_the_extra_of_a_module_comes_from_the_metadata():
    from gatherwise.missing_extra import extra_providing

    assert extra_providing("fastapi") == "sidecar"
    assert extra_providing("opentelemetry.sdk") == "sidecar"
    assert extra_providing("torch") == "engine"
    assert extra_providing("yaml") is None  # a base requirement, not an extra's
    assert extra_providing("no_such_module") is None


def test_the_demo_without_torch_names_the_engine_extra():
    """The demo starts the reference engine: without torch (a `gatherwise[sidecar]` install) it says so at once."""
    code = "import sys; sys.modules['torch'] = None; from gatherwise.cli import main; sys.exit(main(['demo']))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'gatherwise[engine]'" in lines[0], lines
