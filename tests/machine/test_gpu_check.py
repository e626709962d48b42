"""scripts/gpu_check.sh on the CPU (--cpu): every check runs its CPU part through the real script and entry
point and writes the JSON and the summary; the GPU-only part (graph capture) is reported as skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests._repo import ROOT
from tests.machine import gpu_checks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(280)]


def test_the_script_runs_every_check_on_the_cpu_and_writes_its_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh"), str(out), "--cpu"], capture_output=True,
                          text=True, timeout=260, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "gpu_check.json").read_text())
    checks = report["checks"]
    assert list(checks) == gpu_checks.CHECKS.names()
    assert checks["graphs"]["status"] == "skip" and "CUDA" in checks["graphs"]["reason"]
    for name in ("sync_free", "tp2_gloo_cuda", "event_timing", "sampler", "hook_overhead", "header_metrics"):
        assert checks[name]["status"] == "pass", (name, checks[name])
    from gatherwise.modes import IMPLEMENTED

    labels = {m.label for m in IMPLEMENTED}  # every mode there is, whatever it is
    # every mode and every sampling kind; the kinds that synchronize by design are named with the reason
    assert {tuple(k.split("/")) for k in checks["sync_free"]["runs"]} == {
        (mode, kind) for mode in labels for kind in gpu_checks.KINDS}
    assert set(checks["sync_free"]["syncs_by_design"]) == {"top_p"}
    assert checks["event_costs"]["status"] == "skip" and "CUDA" in checks["event_costs"]["reason"]
    assert set(checks["hook_overhead"]["modes"]) == labels
    # every mode, and the exchange of per-shard winners that vLLM Model Runner V2's keyed sharding runs
    assert set(checks["tp2_gloo_cuda"]["modes"]) == labels | {"sharded_winners"}
    summary = (out / "summary.txt").read_text()
    assert summary.startswith("gatherwise gpu check on CPU (fallback)") and "overall: ok" in summary
    assert report["environment"]["cpu_fallback"] is True


def test_the_script_runs_from_a_plain_checkout_with_nothing_installed(tmp_path: Path) -> None:
    """A lent GPU machine has a copy of the checkout and no install of it: this interpreter without its site
    processing (no .pth file, so no editable install finds the floors), its packages still on the path."""
    packages = ":".join(dict.fromkeys(sysconfig.get_paths()[kind] for kind in ("purelib", "platlib")))
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexport PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{packages}"\n'
                      f'exec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    out = tmp_path / "out"
    proc = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh"), str(out), "--cpu", "--only", "header_metrics"],
                          capture_output=True, text=True, timeout=200, env={**os.environ, "PYTHON": str(python)},
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((out / "gpu_check.json").read_text())["checks"]["header_metrics"]["status"] == "pass"


def test_without_cuda_the_gpu_run_refuses_instead_of_pretending(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(SystemExit, match="no CUDA device"):
        gpu_checks.run(tmp_path, cpu=False)


def test_unknown_check_names_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        gpu_checks.main(["/nonexistent", "--only", "nope"])
    assert "unknown check(s): nope" in capsys.readouterr().err
