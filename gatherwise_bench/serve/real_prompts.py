"""Real text for `gatherwise bench serve` on a trained model: the prose paragraphs of Python's own documentation
(the `pydoc_data.topics` module every CPython install carries, 817 paragraphs of English in 3.11), each turned into
one request the way its model is used: an instruct model gets a chat question through its chat template ("Explain
this passage ..."), a base model the passage itself to continue. Prompts are rendered here, so both engines' clients
send the same text (with --skip-chat-template / no template of their own), and cut at a word boundary to fit the
workload's input length in the model's own tokens.

Every (round, cell) of a benchmark draws its own range of the pool, permuted once by the dataset seed: no prompt of
a warm-up round reaches the measured pass (an engine's prefix cache would serve it), and every configuration gets
the same prompts for the same cell.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

CHAT_QUESTION = "Explain this passage from the Python documentation in plain words: "
MIN_WORDS = 15  # shorter paragraphs are headings, captions and fragments


def documentation_paragraphs() -> list[str]:
    """The prose paragraphs of Python's documentation topics, whitespace collapsed, in a fixed order (no code:
    indented blocks and interactive examples are left out)."""
    from pydoc_data.topics import topics

    paragraphs = (p for name in sorted(topics) for p in re.split(r"\n\s*\n", topics[name]))
    return [" ".join(p.split()) for p in paragraphs
            if not p.startswith(" ") and ">>>" not in p and len(p.split()) >= MIN_WORDS]


@dataclass(frozen=True)
class RealPrompts:
    """The pool of rendered prompts for one model, each at most `input_len` of its tokens."""

    prompts: tuple[str, ...]
    chat: bool  # rendered through the model's chat template

    @classmethod
    def for_model(cls, model: Path, input_len: int) -> RealPrompts:
        from gatherwise.tp_engine.tokenizer import CheckpointTokenizer

        tokenizer = CheckpointTokenizer(model)
        chat = tokenizer.has_chat_template()

        def render(words: list[str]) -> str:
            text = " ".join(words)
            return tokenizer.render_chat(CHAT_QUESTION + text) if chat else text

        prompts = []
        for paragraph in documentation_paragraphs():
            words = paragraph.split()
            while len(words) > MIN_WORDS // 2 and len(tokenizer.encode(render(words))) > input_len:
                words = words[: max(MIN_WORDS // 2, len(words) * 3 // 4)]
            if len(tokenizer.encode(render(words))) <= input_len:
                prompts.append(render(words))
        if not prompts:
            raise ValueError(f"no documentation paragraph fits {input_len} tokens of {model}")
        return cls(tuple(dict.fromkeys(prompts)), chat)  # a paragraph cut short may equal another's start

    def draw(self, seed: int, start: int, count: int) -> list[str]:
        """Prompts start .. start + count - 1 of the pool permuted by `seed`: callers give each (round, cell) its
        own range, disjoint while the pool lasts, then wrapping around (results.json records the pool size)."""
        order = list(self.prompts)
        random.Random(seed).shuffle(order)
        return [order[(start + i) % len(order)] for i in range(count)]
