"""The vLLM plugin's safety decisions that need no vLLM: an unusable shm_dir turns the plugin off before any
worker exists (never a failure inside one rank's first step), and its log lines reach stderr in a process where
nobody configured logging (as in vLLM's workers). vLLM itself is faked here; tests/vllm/ runs the real one."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from gatherwise.engine_hooks.adapters.vllm import patches as vllm_patches
from gatherwise.engine_hooks.adapters.vllm import plugin as vllm_plugin
from tests._sidecar import ROOT


def _no_apply(hooks):
    raise AssertionError("vLLM must not be patched")


def test_unsafe_shm_dir_turns_the_plugin_off_with_one_warning(monkeypatch, caplog, tmp_path):
    shm = tmp_path / "open"
    shm.mkdir()
    shm.chmod(0o777)
    monkeypatch.setattr(vllm_plugin.PLUGIN, "registered", False)
    monkeypatch.setenv("GATHERWISE_ENABLE", "1")
    monkeypatch.setenv("GATHERWISE_ENGINE_SHM_DIR", str(shm))
    monkeypatch.setattr(vllm_patches, "compatibility_problems", lambda check: [])
    monkeypatch.setattr(vllm_patches, "apply", _no_apply)
    with caplog.at_level(logging.WARNING, logger="gatherwise.vllm"):
        vllm_plugin.register()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "engine.shm_dir is unusable" in warnings[0] and "lets other users write" in \
        warnings[0] and "leaves vLLM untouched" in warnings[0]
    assert os.listdir(shm) == []


def test_plugin_lines_are_visible_without_logging_configuration():
    code = ("import logging; from gatherwise.engine_hooks.adapters.vllm.plugin import attach_log_handler; "
            "attach_log_handler(); "
            "logging.getLogger('gatherwise.vllm').info('gatherwise: hooks installed on TP rank 0/2')")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert "INFO" in result.stderr and "[gatherwise.vllm] gatherwise: hooks installed on TP rank 0/2" in result.stderr


@pytest.mark.timeout(120)
def test_exit_cleanup_removes_only_dead_engines_dirs(shm_dir):
    """What every vLLM process runs when it exits: dead engines' directories go, a live one stays."""
    code = f"""
import os, sys
from gatherwise.shm_format.liveness import LivenessLock
from gatherwise.shm_format.private_files import ensure_private_dir
for name, keep in (("00000000000000aa", False), ("00000000000000bb", True)):
    lock = LivenessLock(ensure_private_dir(os.path.join({shm_dir!r}, name)), 0)
    if keep:
        kept = lock
    else:
        lock.close()
from gatherwise.engine_hooks.adapters.engine_dirs import remove_dead_dirs
remove_dead_dirs({shm_dir!r})
print(sorted(os.listdir({shm_dir!r})))
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['00000000000000bb']"
