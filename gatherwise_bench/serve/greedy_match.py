"""Whether a greedy run's outputs equal the plain engine's, token for token.

The clients save each request's generated text (in request order; the random dataset is seeded, so every
configuration sends the same prompts in the same order). They are compared exactly, request by request; where one
differs, both texts are turned back into tokens with the checkpoint's tokenizer (its word ids re-encode to
themselves, gatherwise_bench/serve/tokenizer.py) to say at which token the outputs diverged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class TokenCounter:
    def __init__(self, model: Path) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))

    def ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids


def compare_outputs(reference: list[str], outputs: list[str], tokens: TokenCounter) -> dict[str, Any]:
    """{"requests", "equal", "all_equal", "first_difference": {"request", "token"} | None}"""
    if len(reference) != len(outputs):
        return {"requests": len(outputs), "equal": 0, "all_equal": False,
                "first_difference": {"request": None, "token": None,
                                     "why": f"{len(outputs)} outputs vs the reference's {len(reference)}"}}
    equal, first = 0, None
    for i, (want, got) in enumerate(zip(reference, outputs, strict=True)):
        if want == got:
            equal += 1
            continue
        if first is None:
            a, b = tokens.ids(want), tokens.ids(got)
            position = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            first = {"request": i, "token": position}
    return {"requests": len(outputs), "equal": equal, "all_equal": equal == len(outputs), "first_difference": first}
