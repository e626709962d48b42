"""What must hold on a GPU (run by scripts/gpu_check.sh, which also records the numbers). Skipped without CUDA:
the same logic runs on the CPU in test_deferred_word.py, test_graphs.py, test_cuda_timing.py and
test_gpu_check.py."""

from __future__ import annotations

import pytest
import torch

from gatherwise_bench import gpu_check

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: run scripts/gpu_check.sh OUTDIR on a GPU machine")]


@pytest.fixture
def ctx(tmp_path):
    return {"device": "cuda:0", "cpu": False, "tmp": str(tmp_path), "root": ".", "left": lambda: 300.0}


def test_the_path_never_synchronizes_in_steady_state_in_any_mode(ctx):
    result = gpu_check.check_sync_free(ctx)
    assert result["status"] == "pass", result["failed"]


def test_one_captured_variant_per_mode_replays_the_eager_tokens_and_switches(ctx):
    result = gpu_check.check_graphs(ctx)
    assert result["status"] == "pass", result


def test_event_timings_are_device_time_within_the_wall_clock(ctx):
    result = gpu_check.check_event_timing(ctx)
    assert result["status"] == "pass", result["modes"]


def test_header_counters_count_every_call_through_the_cuda_timing_path(ctx):
    result = gpu_check.check_header_metrics(ctx)
    assert result["status"] == "pass", result
