"""`gatherwise generate` with real prompts on a checkpoint that ships a tokenizer: text and id prompts, the chat
template, end-of-sequence stops and the JSON output, held against transformers' tokenizer and generate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gatherwise.tp_engine.generate_cli import generate_main
from tests._generate_cli import assert_refused, generate_json
from tests._hf_checkpoints import TinyCheckpoint, build, load_reference, reference_greedy, write_tokenizer

TEXTS = ("the quick brown fox", "what is the capital of france?")
MAX_NEW = 6


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama checkpoint whose vocabulary is its tokenizer's, with a chat template and </s> as EOS."""
    directory = tmp_path_factory.mktemp("chat") / "ckpt"
    vocab = write_tokenizer(directory)
    build(TinyCheckpoint("chat", "llama", dict(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                               bos_token_id=1, eos_token_id=2)), directory)
    return directory


@pytest.fixture(scope="module")
def hf_tokenizer(checkpoint):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(checkpoint)


@pytest.mark.timeout(300)
def test_text_and_id_prompts_match_transformers(checkpoint, hf_tokenizer):
    out = generate_json("--checkpoint", str(checkpoint), "--tp", "2", "--mode", "gather", "--max-new-tokens",
                        str(MAX_NEW), "--prompt", TEXTS[0], "--prompt-ids", "5,6,7", "--prompt", TEXTS[1])
    want_prompts = [hf_tokenizer(TEXTS[0]).input_ids, [5, 6, 7], hf_tokenizer(TEXTS[1]).input_ids]
    assert out["prompt_ids"] == want_prompts and want_prompts[0][0] == 1  # BOS from tokenizer.json
    want = reference_greedy(load_reference(checkpoint), want_prompts, MAX_NEW)
    assert out["tokens"] == want
    assert out["text"] == [hf_tokenizer.decode(t, skip_special_tokens=True) for t in want]
    assert out["finish_reasons"] == ["stop" if t[-1] == 2 else "length" for t in want]
    assert set(out["modes"][0]) == {"gather"}


@pytest.mark.timeout(300)
def test_chat_prompt_uses_the_checkpoint_template(checkpoint, hf_tokenizer):
    out = generate_json("--checkpoint", str(checkpoint), "--max-new-tokens", "3", "--chat", "--prompt", TEXTS[1])
    messages = [{"role": "user", "content": TEXTS[1]}]
    want = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    want = want["input_ids"] if hasattr(want, "keys") else want  # transformers 5 returns a BatchEncoding
    assert out["prompt_ids"] == [list(want)]
    ids = out["prompt_ids"][0]
    assert ids[:2] == [1, 3] and ids[-2:] == [2, 4]  # <s><|user|> ... </s><|assistant|>


@pytest.mark.timeout(300)
def test_generation_stops_at_the_checkpoints_eos_unless_ignored(checkpoint, tmp_path):
    """EOS made a token the model really produces: generation_config.json's list is what both engines stop at."""
    import shutil

    prompt = [30, 31, 32, 33]
    free = reference_greedy(load_reference(checkpoint), [prompt], 8)[0]
    stop_at = next(i for i, t in enumerate(free) if t not in free[:i] and i >= 2)  # first occurrence, not at once
    ckpt = shutil.copytree(checkpoint, tmp_path / "eos")
    config = json.loads((ckpt / "generation_config.json").read_text())
    (ckpt / "generation_config.json").write_text(json.dumps({**config, "eos_token_id": [free[stop_at], 2]}))
    args = ("--checkpoint", str(ckpt), "--tp", "3", "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens",
            "8")
    stopped = generate_json(*args)
    assert stopped["tokens"] == [free[: stop_at + 1]] == reference_greedy(load_reference(ckpt), [prompt], 8)
    assert stopped["finish_reasons"] == ["stop"]
    ignored = generate_json(*args, "--ignore-eos")
    assert ignored["tokens"] == [free] and ignored["finish_reasons"] == ["length"]


def test_random_prompts_stay_the_default_without_a_checkpoint(capsys):
    assert generate_main(["--prompts", "2", "--max-new-tokens", "2", "--vocab", "97", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["prompt_ids"]) == 2 and all(0 <= t < 97 for p in out["prompt_ids"] for t in p)
    assert "text" not in out and out["finish_reasons"] == ["length", "length"]


@pytest.mark.parametrize("argv, message", [
    (["--prompt", "hi"], "--prompt needs --checkpoint"),
    (["--chat", "--prompt-ids", "1"], "--chat applies to --prompt TEXT"),
    (["--prompts", "2", "--prompt-ids", "1"], "does not combine with --prompt/--prompt-ids"),
    (["--prompt-ids", "1,x"], "not a comma-separated list of token ids"),
    (["--prompt-ids", "1,-2"], "token ids must be >= 0"),
    (["--prompt", ""], "empty prompt"),
    (["--vocab", "97", "--prompt-ids", "3,97"], "token id 97 outside the vocabulary 0..96"),
])
def test_bad_prompt_arguments_are_refused(argv, message, capsys):
    assert_refused(argv, message, capsys)


def test_checkpoint_problems_are_refused_before_any_rank_starts(checkpoint, tmp_path, capsys):
    import shutil

    bare = shutil.copytree(checkpoint, tmp_path / "bare")
    (bare / "tokenizer.json").unlink()
    with pytest.raises(SystemExit):
        generate_main(["--checkpoint", str(bare), "--prompt", "hi"])
    assert "--prompt needs a tokenizer.json in the checkpoint directory" in capsys.readouterr().err
    raw = json.loads((bare / "config.json").read_text())
    (bare / "config.json").write_text(json.dumps({**raw, "quantization_config": {"quant_method": "gptq"}}))
    with pytest.raises(SystemExit):
        generate_main(["--checkpoint", str(bare), "--prompt-ids", "1"])
    assert "config key 'quantization_config'" in capsys.readouterr().err
