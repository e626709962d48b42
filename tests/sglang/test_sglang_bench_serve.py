"""`gatherwise bench serve --engine sglang --quick`: SGLang's OpenAI-compatible server (TP=2 on CPU), plain and
with gatherwise pinned to gather next to a real sidecar, driven by `sglang.bench_serving`, so the benchmark cannot
rot. Function only: no timing is asserted."""

from __future__ import annotations

import pytest

from tests._bench_serve_quick import check_quick, run_quick

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_bench_serve_quick_runs_plain_and_pinned_gather(tmp_path):
    results = run_quick("sglang", tmp_path)
    print(results["table"])
    check_quick(results)
