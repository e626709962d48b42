"""The SGLang tests run in their own venv (`make test-sglang` builds .venv-sglang with sglang 0.5.23).

Without an importable SGLang the whole directory skips with the reason, except when CI=true and
GATHERWISE_SGLANG_TESTS=1 (what .ci/run sets for `make test-sglang`): then it fails.
"""

from __future__ import annotations

import importlib.util

import pytest

from tests._engine_harness import require_engine, tiny_model

SGLANG_FOUND = importlib.util.find_spec("sglang") is not None  # importing sglang itself takes seconds


@pytest.fixture(scope="session", autouse=True)
def _sglang_installed() -> None:
    require_engine(None if SGLANG_FOUND else
                   "SGLang is not installed here; `make test-sglang` builds .venv-sglang and runs these",
                   "GATHERWISE_SGLANG_TESTS")


@pytest.fixture(scope="session")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_model("GATHERWISE_SGLANG_MODEL", tmp_path_factory)
