"""The SGLang tests run in their own venv (`make test-sglang` builds .venv-sglang with sglang 0.5.23).

Without an importable SGLang the whole directory skips with the reason, except when CI=true and
GATHERWISE_SGLANG_TESTS=1 (what .ci/run sets for `make test-sglang`): then it fails.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

SGLANG_FOUND = importlib.util.find_spec("sglang") is not None  # importing sglang itself takes seconds
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
REQUIRED = IN_CI and os.environ.get("GATHERWISE_SGLANG_TESTS") == "1"


@pytest.fixture(scope="session", autouse=True)
def _sglang_installed() -> None:
    if SGLANG_FOUND:
        return
    message = "SGLang is not installed here; `make test-sglang` builds .venv-sglang and runs these"
    if REQUIRED:
        pytest.fail(message + "; with CI=true and GATHERWISE_SGLANG_TESTS=1 that is a failure", pytrace=False)
    pytest.skip(message)
