"""What a row asks of the sampler, and its randomness: one counter-based uniform per row.

The uniform is a pure function of (seed, request id, position), so a token never depends on the mode, on the
layout of the logits or on how many calls ran before.
"""

from __future__ import annotations

from dataclasses import dataclass

from gatherwise.call_kind import call_kind, sampling_of_rows

_MASK64 = (1 << 64) - 1


def _mix64(z: int) -> int:
    """splitmix64 finalizer: a bijective 64-bit mix with good avalanche."""
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB & _MASK64
    return z ^ (z >> 31)


def row_uniform(seed: int, request_id: int, position: int) -> float:
    """A uniform in [0, 1) that depends only on (seed, request, position)."""
    z = _mix64((seed & _MASK64) ^ 0x9E3779B97F4A7C15)
    z = _mix64(z ^ (request_id & _MASK64))
    z = _mix64(z ^ (position & _MASK64))
    return (z >> 11) * (1.0 / (1 << 53))


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means off
    top_p: float = 1.0  # 1.0 means off
    seed: int = 0
    min_p: float = 0.0  # 0.0 means off; else keep tokens whose probability is >= min_p * the row's largest

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class SamplingRow:
    """What the sampler needs to know about one row of the batch."""

    params: SamplingParams
    request_id: int
    position: int  # index of the token being produced within its request


def kind_of_rows(rows: list[SamplingRow]) -> int:
    """The call kind (gatherwise.call_kind) of a batch: the heaviest sampling any of its rows asks for (min-p is a
    truncation like top-k there, as the engines' adapters count it)."""
    sampled = [r.params for r in rows if not r.params.greedy]
    return call_kind(sampling_of_rows(not sampled, any(p.top_p < 1.0 for p in sampled),
                                      any(p.top_k > 0 or p.min_p > 0.0 for p in sampled)))
