"""Shared test helpers: external tools that must exist in CI, free ports, shm dirs under tmp_path, the engine
tests' peaked checkpoint."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# tests/vllm/ and tests/sglang/ need their engine and run in its own venv (`make test-vllm`, `make test-sglang`);
# elsewhere the directory is not collected.
collect_ignore = [engine for engine in ("vllm", "sglang")
                  if not importlib.util.find_spec(engine)
                  and os.environ.get(f"GATHERWISE_{engine.upper()}_TESTS") != "1"]


def require_tool(name: str) -> str:
    """Path of an external tool; skip with a clear reason when missing locally, fail when CI=true."""
    path = shutil.which(name)
    if path:
        return path
    message = f"{name!r} is not installed (make apt installs it as root)"
    if IN_CI:
        pytest.fail(f"{message}; CI installs every tool, so this is a failure", pytrace=False)
    pytest.skip(message)


SHM_PREFIX = "gatherwise-test-"


def _remove_dead_runs(base: str) -> None:
    """Directories of test runs that were killed before their teardown (their pid is gone): removed, so a
    killed run leaves nothing behind for long."""
    for name in os.listdir(base):
        pid = name[len(SHM_PREFIX):].split("-")[0] if name.startswith(SHM_PREFIX) else ""
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)


@pytest.fixture
def shm_dir(tmp_path):
    """A private shared-memory directory for one test (under /dev/shm when available, else tmp_path)."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else str(tmp_path)
    _remove_dead_runs(base)
    path = os.path.join(base, f"{SHM_PREFIX}{os.getpid()}-{os.urandom(4).hex()}")
    os.makedirs(path, mode=0o700)  # private at any umask, as the engine requires of its shm_dir
    yield path
    shutil.rmtree(path, ignore_errors=True)


HEAD_ENTROPY = 2.5  # nats at T = 1, as `gatherwise bench serve --head-entropy` builds realistic logits


@pytest.fixture(scope="module")
def peaked(model: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The engine directory's tiny checkpoint (`model`) with its logits scaled to HEAD_ENTROPY, for the tests
    that compare sampled tokens across batches. The random init's rows are near flat (top-p 0.95 keeps 20 000 of
    32 000 tokens), so a sampled token hangs on logit differences of 1e-6, and the engines' CPU forwards can give
    a row logits that differ by that much alone and in a batch: no sampler could then draw the same token in
    both. Scaled, the kept tokens are a dozen, 1e-3 or more apart."""
    import torch
    import transformers

    from gatherwise.bench.serve.checkpoints import scale_to_entropy

    checkpoint = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    scale_to_entropy(checkpoint, checkpoint.config.vocab_size, HEAD_ENTROPY, seed=0)
    out = tmp_path_factory.mktemp("tiny-llama-peaked")
    checkpoint.save_pretrained(out)
    return str(out)
