"""The engine on checkpoints that transformers wrote, against transformers' own greedy generate.

Both config layouts, GQA and MHA, odd vocabularies, tied and untied embeddings, Llama's attention and MLP
biases, Qwen2's q/k/v biases and sliding window, each supported RoPE type, Gemma3 (its norms, embedding scale,
GeGLU, attention scalar, and RoPE per layer type with sliding and global layers): P = 1, 2, 3 in every implemented
logits mode (and a switch schedule) must produce exactly the tokens transformers' `generate` produces.
One spawn per P runs every checkpoint and mode; P = 1 runs in this process.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from gatherwise.modes import IMPLEMENTED
from gatherwise.tp_engine.hf_config import eos_token_ids
from gatherwise.tp_engine.launch import launch
from gatherwise.tp_engine.runner import GenerateSpec, ModelSpec, generate_rank
from tests._hf_checkpoints import TinyCheckpoint, build, load_reference, reference_greedy

MODES = (*(m.label for m in IMPLEMENTED), "schedule:5")
PROMPTS = ([5, 17, 3, 99, 42, 8, 61, 23, 7], [1], [88, 2, 14], [30, 31, 32, 33, 34, 35])
MAX_NEW_TOKENS = 8

CHECKPOINTS = (
    TinyCheckpoint("llama gqa old-layout untied", "llama", dict(
        vocab_size=211, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}), layout="old", seed=1),
    TinyCheckpoint("llama biases linear tied bf16", "llama", dict(
        vocab_size=199, hidden_size=32, intermediate_size=72, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, attention_bias=True, mlp_bias=True, tie_word_embeddings=True,
        rope_parameters={"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0}),
        dtype=torch.bfloat16, seed=2),
    TinyCheckpoint("llama llama3 old-layout head_dim 8", "llama", dict(
        vocab_size=173, hidden_size=24, head_dim=8, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256,
        rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64}), layout="old", seed=3),
    TinyCheckpoint("llama yarn", "llama", dict(
        vocab_size=157, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 32}), seed=4),
    TinyCheckpoint("llama linear legacy type key", "llama", dict(
        vocab_size=131, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 3.0}),
        layout="old", legacy_type_key=True, seed=5),
    TinyCheckpoint("qwen2 tied", "qwen2", dict(
        vocab_size=151, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}), seed=6),
    TinyCheckpoint("qwen2 sliding window old-layout", "qwen2", dict(
        vocab_size=163, hidden_size=48, intermediate_size=64, num_hidden_layers=3, num_attention_heads=6,
        num_key_value_heads=3, use_sliding_window=True, sliding_window=4, max_window_layers=1,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}), layout="old", seed=7),
    TinyCheckpoint("qwen2 yarn bf16", "qwen2", dict(
        vocab_size=149, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1000.0, "factor": 2.0, "beta_fast": 16.0,
                         "original_max_position_embeddings": 16}), dtype=torch.bfloat16, seed=8),
    TinyCheckpoint("gemma3 sliding and global layers, MQA", "gemma3_text", dict(
        vocab_size=181, hidden_size=40, head_dim=16, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=1, sliding_window=4, query_pre_attn_scalar=12,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10.0}}), seed=9),
    TinyCheckpoint("gemma3 linear global rope bf16", "gemma3_text", dict(
        vocab_size=167, hidden_size=36, head_dim=8, intermediate_size=48, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, sliding_window=3, layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}),
        dtype=torch.bfloat16, seed=10),
)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    base = tmp_path_factory.mktemp("hf")
    return [build(spec, base / f"ckpt{i}") for i, spec in enumerate(CHECKPOINTS)]


@pytest.fixture(scope="module")
def expected(checkpoints: list[Path]) -> list[list[list[int]]]:
    """transformers' greedy tokens for every checkpoint and prompt."""
    return [reference_greedy(load_reference(c), [list(p) for p in PROMPTS], MAX_NEW_TOKENS) for c in checkpoints]


def engine_tokens(rank: int, world: int, checkpoints: list[str]) -> list[list[list[list[int]]]]:
    """Rank main: [checkpoint][mode] -> tokens of every prompt (greedy, stopping at the checkpoint's EOS)."""
    out = []
    for ckpt in checkpoints:
        per_mode = []
        for mode in MODES:
            spec = GenerateSpec(model=ModelSpec(checkpoint=ckpt), mode=mode, max_new_tokens=MAX_NEW_TOKENS,
                                prompts=tuple(tuple(p) for p in PROMPTS), stop_ids=eos_token_ids(ckpt))
            run = generate_rank(rank, world, spec)
            per_mode.append([run.tokens[i] for i in range(len(PROMPTS))])
        out.append(per_mode)
    return out


def test_the_checkpoints_exercise_what_they_claim(checkpoints, expected):
    """The suite is only worth something if the paths differ: rope types change tokens, layouts really differ."""
    import json

    raws = [json.loads((c / "config.json").read_text()) for c in checkpoints]
    assert sum("rope_parameters" in r for r in raws) >= 3 and sum("rope_theta" in r for r in raws) >= 3
    assert raws[4]["rope_scaling"]["type"] == "linear"
    assert not (checkpoints[1] / "model.safetensors").read_bytes().count(b"lm_head.weight")  # tied: no head
    for tokens in expected:  # not degenerate: several distinct tokens per checkpoint
        assert len({t for seq in tokens for t in seq}) >= 5


@pytest.mark.timeout(900)
@pytest.mark.parametrize("world", [1, 2, 3])
def test_greedy_tokens_match_transformers_in_every_mode(world, checkpoints, expected):
    paths = [str(c) for c in checkpoints]
    if world == 1:
        threads = torch.get_num_threads()
        try:
            ranks = [engine_tokens(0, 1, paths)]
        finally:
            torch.set_num_threads(threads)
    else:
        ranks = launch(engine_tokens, world, paths, timeout=600)
    for rank, result in enumerate(ranks):
        for c, spec in enumerate(CHECKPOINTS):
            for m, mode in enumerate(MODES):
                assert result[c][m] == expected[c], f"{spec.name}, P={world} rank {rank}, mode {mode}"


def test_logits_match_transformers_at_every_position(checkpoints):
    """Closer than tokens: the whole logits rows of a prompt, against transformers' float64 forward. transformers
    computes RoPE in float32, so agreement is ~1e-6, not bit-exact; a wrong bias, window or RoPE is off by >1e-2."""
    from gatherwise.tp_engine.layers import TPGroup

    prompt = torch.tensor(PROMPTS[0] + PROMPTS[3])  # 15 positions: past the sliding window and the yarn ramp
    for spec, ckpt in zip(CHECKPOINTS, checkpoints, strict=True):
        model = ModelSpec(checkpoint=str(ckpt)).load(TPGroup())
        vocab = model.config.vocab_size
        out = torch.empty(len(prompt), model.shard_width, dtype=torch.float64)
        model.forward(prompt, torch.arange(len(prompt)), torch.zeros(len(prompt), dtype=torch.int64),
                      model.new_cache(1, len(prompt)), torch.arange(len(prompt)), out)
        with torch.no_grad():
            want = load_reference(ckpt)(prompt[None]).logits[0]
        torch.testing.assert_close(out[:, :vocab], want, rtol=1e-5, atol=1e-5,
                                   msg=functools.partial("{}: {}".format, spec.name))
