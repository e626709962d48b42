"""What a logits call samples, as one small integer: the auto policy compares modes only on calls of one kind.

A call's cost differs far more by what it samples than by its collective: on a CPU engine a top-p call over a
150 k vocabulary spends hundreds of ms in the sampler, a greedy one a few ms, so a mode measured on greedy
calls against a window of top-p calls looks 40x faster for a reason that has nothing to do with the collective.
Engines name each call's kind (the heaviest sampling any row of the batch asks for, and whether any row wants
logprobs); the ring record carries it in a 6-bit tag with the mode the call's table named (flags bits 2..7,
docs/shm-format.md), so the policy also knows what a mode costs a kind of call that steps aside from it (a
sampled call under a sharded table runs the engine's all_gather). Stdlib only.
"""

from __future__ import annotations

from enum import IntEnum


class Sampling(IntEnum):
    """The heaviest sampling of any row of a call; ordered by what it costs a sampler."""

    UNKNOWN = 0  # the writer does not say (a ring from before kinds were recorded)
    GREEDY = 1
    TEMPERATURE = 2  # random sampling over the whole row
    TOP_K = 3  # top-k or min-p truncation, no top-p
    TOP_P = 4  # top-p (with or without top-k)


LOGPROBS = 8  # a kind with this bit: some row of the call returns logprobs
KINDS = 16  # kinds fit in 4 bits


def call_kind(sampling: Sampling, logprobs: bool = False) -> int:
    return int(sampling) | (LOGPROBS if logprobs else 0)


def sampling_of_rows(greedy: bool, top_p: bool, top_k: bool) -> Sampling:
    """The Sampling of a batch from the three facts every engine keeps about it."""
    if greedy:
        return Sampling.GREEDY
    if top_p:
        return Sampling.TOP_P
    return Sampling.TOP_K if top_k else Sampling.TEMPERATURE


def kind_label(kind: int) -> str:
    """"greedy", "top_p", "temperature+logprobs", ... (a kind outside the 4 bits reads "unknown")."""
    if not 0 <= kind < KINDS:
        return "unknown"
    sampling = kind & (LOGPROBS - 1)
    name = Sampling(sampling).name.lower() if sampling in Sampling._value2member_map_ else "unknown"
    return name + ("+logprobs" if kind & LOGPROBS else "")


TABLE_MODE_SHIFT = 4  # a tag: kind in bits 0..3, the table's mode code in bits 4..5


def call_tag(kind: int, table_mode: int) -> int:
    return kind | table_mode << TABLE_MODE_SHIFT


def split_tag(tag: int) -> tuple[int, int | None]:
    """(kind, table mode code) of a tag; the mode is None where the kind is 0 (a writer that records neither)."""
    kind = tag & (KINDS - 1)
    return kind, (tag >> TABLE_MODE_SHIFT) & 3 if kind else None
