"""What must hold on a GPU (run by scripts/gpu_check.sh, which also records the numbers). Skipped without CUDA:
the same logic runs on the CPU in test_deferred_word.py, test_graphs.py, test_cuda_timing.py and
test_gpu_check.py."""

from __future__ import annotations

import pytest
import torch
from gatherwise.bench import gpu_check

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: run scripts/gpu_check.sh OUTDIR on a GPU machine")]


@pytest.fixture
def ctx(tmp_path):
    return {"device": "cuda:0", "cpu": False, "tmp": str(tmp_path), "root": ".", "left": lambda: 300.0}


# What each check of gatherwise.bench.gpu_check establishes on the device:
CHECKS = {
    "the path never synchronizes in steady state, in any mode": gpu_check.check_sync_free,
    "one captured variant per mode replays the eager tokens and switches": gpu_check.check_graphs,
    "event timings are device time within the wall clock": gpu_check.check_event_timing,
    "header counters count every call through the CUDA timing path": gpu_check.check_header_metrics,
}


@pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
def test_gpu_check_passes(ctx, check):
    result = check(ctx)
    assert result["status"] == "pass", result
