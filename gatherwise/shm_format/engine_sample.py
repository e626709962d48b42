"""The engine's newest sample output (`sample.json`): text an engine chooses to show beside its logits path.

`<shm_dir>/<engine id>/sample.json`, replaced by the engine's rank 0 each time it has a newer finished output
(0600, temporary name then rename). Only the reference engine's demo load writes it — its own canned prompts,
never a user's request: vLLM and SGLang adapters write none, so a production sidecar has no user text to serve.
The sidecar only shows it (GET /v1/live, the page, the demo's terminal view); the reader is strict about size and
types and clips every string. Stdlib only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gatherwise.shm_format.json_record import is_u63, parse_record, record_json
from gatherwise.shm_format.private_files import read_small_file, write_private_file

FORMAT = 1
NAME = "sample.json"
MAX_SAMPLE_BYTES = 16384
MAX_PROMPT_CHARS = 500
MAX_OUTPUT_CHARS = 2000


@dataclass(frozen=True)
class EngineSample:
    prompt: str  # the prompt's text (a chat user message, or plain text)
    text: str  # what the engine generated for it
    tokens: int  # generated tokens
    wall_ns: int  # when it finished (time.time_ns())

    def to_json(self) -> bytes:
        return record_json(self, FORMAT)

    @classmethod
    def from_json(cls, data: bytes) -> EngineSample:
        """Parse a sample file; ValueError for anything that is not one."""
        obj = parse_record(data, FORMAT, "sample file")
        prompt, text, tokens, wall_ns = obj.get("prompt"), obj.get("text"), obj.get("tokens"), obj.get("wall_ns")
        if not (isinstance(prompt, str) and isinstance(text, str)):
            raise ValueError("prompt or text missing or not a string")
        if not (is_u63(tokens) and is_u63(wall_ns)):
            raise ValueError("tokens or wall_ns not a non-negative integer")
        return cls(prompt[:MAX_PROMPT_CHARS], text[:MAX_OUTPUT_CHARS], tokens, wall_ns)


def sample_path(engine_dir: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(engine_dir), NAME)


def write_sample(engine_dir: str | os.PathLike[str], sample: EngineSample) -> None:
    """Replace the engine's sample (OSError when it cannot be written)."""
    clipped = EngineSample(sample.prompt[:MAX_PROMPT_CHARS], sample.text[:MAX_OUTPUT_CHARS], sample.tokens,
                           sample.wall_ns)
    write_private_file(sample_path(engine_dir), clipped.to_json())


def read_sample(engine_dir: str | os.PathLike[str]) -> EngineSample | None:
    """The engine's newest sample, or None where there is none or it is not one (never raises for the file)."""
    try:
        return EngineSample.from_json(read_small_file(sample_path(engine_dir), MAX_SAMPLE_BYTES))
    except (OSError, ValueError):
        return None
