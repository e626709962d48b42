"""Real traffic for `gatherwise engine --checkpoint DIR`: rounds of real questions answered by a trained model.

Each round takes the next B prompts of a fixed list (cycled), gives request i the i-th sampling kind of the mix,
and runs them to completion with continuous batching: the batch starts at B and shrinks as answers end, so every
bucket up to B sees calls. Every rank builds the same requests; rank 0 publishes the round's first answer as the
engine's sample (gatherwise/shm_format/engine_sample.py) for the sidecar's page and the demo to show.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

from gatherwise.engine_hooks.sampling_params import SamplingParams
from gatherwise.tp_engine.hf_config import eos_token_ids
from gatherwise.tp_engine.runner import Engine
from gatherwise.tp_engine.scheduler import Request
from gatherwise.tp_engine.tokenizer import CheckpointTokenizer

log = logging.getLogger("gatherwise.tp_engine")

# What a chat user asks (an instruct model answers them through its chat template; a base model continues them).
QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Give me three tips for a good night's sleep.",
    "Explain what a prime number is in one sentence.",
    "Why is the sky blue?",
    "Suggest a name for a friendly robot.",
    "What is the difference between weather and climate?",
    "How do I boil an egg?",
    "Translate 'good morning' into Spanish.",
    "What are the three primary colors?",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "What does a tensor-parallel language model server do?",
    "List four planets of the solar system.",
    "How many legs does a spider have?",
    "Write one sentence about autumn leaves.",
    "What is photosynthesis?",
)


class ChatLoad:
    def __init__(self, engine: Engine, checkpoint: str, params: Sequence[SamplingParams], max_new_tokens: int,
                 sample_dir: Path | None) -> None:
        self.engine, self.params, self.max_new_tokens = engine, tuple(params), max_new_tokens
        self.sample_dir = sample_dir  # rank 0's engine directory; None on the other ranks (or without files)
        self.tokenizer = CheckpointTokenizer(checkpoint)
        encode = self.tokenizer.encode_chat if self.tokenizer.has_chat_template() else self.tokenizer.encode
        self.prompts = [tuple(encode(q)) for q in QUESTIONS]
        self.stops = frozenset(eos_token_ids(checkpoint))
        self.next_request = 0

    def round(self, rows: int) -> None:
        """B = `rows` requests run to completion; rank 0 then publishes the first answer."""
        first = self.next_request
        requests = [Request(first + i, self.prompts[(first + i) % len(self.prompts)], self.max_new_tokens,
                            params=self.params[i % len(self.params)], stop_ids=self.stops) for i in range(rows)]
        self.next_request += rows
        result = self.engine.generate(requests)
        if self.sample_dir is not None:
            self._publish(self.sample_dir, first % len(self.prompts), result.tokens[first])

    def _publish(self, directory: Path, question: int, tokens: list[int]) -> None:
        from gatherwise.shm_format.engine_sample import EngineSample, write_sample

        sample = EngineSample(QUESTIONS[question], self.tokenizer.decode(tokens), len(tokens), time.time_ns())
        try:
            write_sample(directory, sample)
        except OSError as exc:  # only what the page shows is missing; say it once
            log.warning("gatherwise engine: cannot write its sample in %s (%s); the page shows no text",
                        directory, exc)
            self.sample_dir = None
