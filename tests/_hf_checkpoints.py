"""Tiny Llama/Qwen2/Gemma3 checkpoints written by transformers itself, and transformers' own greedy generate as the
oracle.

transformers is a test-only dependency (the `dev` extra) and is imported inside the functions, so spawned
engine ranks that import a test module never pay for it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gatherwise.bench.serve.checkpoints import initialise_random

if TYPE_CHECKING:
    from transformers import GenerationMixin, PreTrainedModel

    class CausalLM(PreTrainedModel, GenerationMixin):
        """What AutoModelForCausalLM loads: a transformers model that generates."""


@dataclass(frozen=True)
class TinyCheckpoint:
    name: str
    model_type: str  # llama | qwen2 | gemma3_text
    config: dict[str, Any]  # keyword arguments of LlamaConfig / Qwen2Config / Gemma3TextConfig
    layout: str = "new"  # new: rope_parameters (transformers >= 5); old: top-level rope_theta + rope_scaling
    legacy_type_key: bool = False  # old layout only: rope_scaling names its type under "type", as early configs did
    dtype: torch.dtype = torch.float32  # storage dtype of the safetensors
    seed: int = 0
    generation: dict[str, Any] = field(default_factory=dict)  # written over generation_config.json


def build(spec: TinyCheckpoint, directory: Path) -> Path:
    """save_pretrained a randomly initialised model (scales that keep logits O(1) and every bias non-zero)."""
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM),
                             "qwen2": (Qwen2Config, Qwen2ForCausalLM),
                             "gemma3_text": (Gemma3TextConfig, Gemma3ForCausalLM)}[spec.model_type]
    config = config_cls(**spec.config)
    torch.manual_seed(spec.seed)
    model = model_cls(config)
    initialise_random(model, spec.seed, noise_dtype=torch.float64)
    model.to(spec.dtype).save_pretrained(directory)
    if spec.layout == "old":
        _to_old_layout(directory / "config.json", spec.legacy_type_key)
    if spec.generation:
        path = directory / "generation_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **spec.generation}, indent=2))
    return directory


def _to_old_layout(path: Path, legacy_type_key: bool) -> None:
    """Rewrite transformers >= 5's `rope_parameters` as the older top-level `rope_theta` + `rope_scaling`."""
    raw = json.loads(path.read_text())
    rope = dict(raw.pop("rope_parameters"))
    raw["rope_theta"] = rope.pop("rope_theta")
    rope_type = rope.pop("rope_type")
    raw["rope_scaling"] = None if rope_type == "default" else {("type" if legacy_type_key else "rope_type"): rope_type,
                                                               **rope}
    path.write_text(json.dumps(raw, indent=2))


def load_reference(directory: Path) -> CausalLM:
    """transformers' own model from the directory, in float64 with its eager (plain matmul) attention."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float64, attn_implementation="eager")
    return model.eval()


def reference_greedy(model: CausalLM, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """transformers' greedy generate, one prompt at a time (no padding), stopping at its generation config's EOS."""
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            seq = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False, pad_token_id=0)
            out.append(seq[0, len(prompt):].tolist())
    return out


# -- a small byte-level BPE tokenizer (the kind Llama 3 and Qwen2 ship) ---------------------------------------
SPECIAL = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] | trim }}{{ eos_token }}"
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "tensor parallel serving splits the vocabulary across ranks",
    "each rank holds a shard of the logits and the sampler needs all of them",
    "gather sends every shard to rank zero which samples and broadcasts the token",
    "all gather gives every rank the full row so each samples by itself",
    "what is the capital of france? paris is the capital of france.",
]


def write_tokenizer(directory: Path, vocab_size: int = 300) -> int:
    """tokenizer.json (BPE trained here; BOS added by its post-processor) and tokenizer_config.json with a
    chat template; returns the tokenizer's vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS * 4, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "chat_template": CHAT_TEMPLATE}))
    return tok.get_vocab_size(with_added_tokens=True)
