"""`--sampling` items of `gatherwise bench`: one sampling configuration per item, applied to every row.

    greedy            temperature 0
    top_k=50          top-k 50 at temperature 1
    top_p=0.9         top-p 0.9 at temperature 1
    temperature=0.8   temperature only (exact sampling over the whole vocab)

Stdlib only: argument errors come before any heavy import.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingSpec:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def label(self) -> str:
        if self.temperature == 0.0:
            return "greedy"
        if self.top_k:
            return f"top_k={self.top_k}"
        if self.top_p < 1.0:
            return f"top_p={self.top_p:g}"
        return f"temperature={self.temperature:g}"


def parse_sampling(text: str) -> SamplingSpec:
    """One item: greedy | top_k=K | top_p=P | temperature=T."""
    text = text.strip()
    if text == "greedy":
        return SamplingSpec()
    key, sep, value = text.partition("=")
    try:
        if sep and key == "top_k":
            k = int(value)
            if k >= 1:
                return SamplingSpec(temperature=1.0, top_k=k)
        elif sep and key == "top_p":
            p = float(value)
            if 0.0 < p < 1.0:
                return SamplingSpec(temperature=1.0, top_p=p)
        elif sep and key == "temperature":
            t = float(value)
            if t > 0.0:
                return SamplingSpec(temperature=t)
    except ValueError:
        pass
    raise ValueError(f"bad sampling {text!r}: expected greedy, top_k=K (K >= 1), top_p=P (0 < P < 1) or "
                     "temperature=T (T > 0)")
