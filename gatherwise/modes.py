"""Modes, batch-size buckets, mode tables and the 64-bit control word (docs/architecture.md).

Stdlib only: the sidecar imports this module too, and it must never pull in torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import cast

NUM_BUCKETS = 16
BITS_PER_BUCKET = 2
CONTROL_WORD_VERSION = 1


class Mode(IntEnum):
    """How the vocab shards reach the sampler. The values are the 2-bit codes in a table."""

    ALL_GATHER = 0
    GATHER = 1
    SHARDED = 2  # every rank samples from its own shard; only what sampling needs is exchanged

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Mode:
        try:
            mode = cls[text.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown mode {text!r}: expected one of {', '.join(IMPLEMENTED_LABELS)}") from None
        return mode


IMPLEMENTED = tuple(Mode)
IMPLEMENTED_LABELS = tuple(m.label for m in IMPLEMENTED)
# The modes a CUDA graph can hold. Sharded decides on the host from the exchanged summaries (which rows fall back,
# who owns a draw), so a graph cannot hold it: a table that selects it runs those calls eagerly. Here, in the
# core, so the config (engine.graph_modes) refuses the rest when it loads, before an engine captures anything.
CAPTURABLE = (Mode.ALL_GATHER, Mode.GATHER)
CAPTURABLE_LABELS = tuple(m.label for m in CAPTURABLE)
LABEL_OF_CODE: dict[int, str] = {int(m): m.label for m in Mode}  # a code no mode has (3) is absent


def bucket_of(rows: int) -> int:
    """Bucket index of a call with `rows` rows: ceil(log2(rows)), clamped to the last bucket."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    return min((rows - 1).bit_length(), NUM_BUCKETS - 1)


def bucket_upper_bound(bucket: int) -> int:
    """Largest row count in `bucket` (the last bucket is open-ended; its label is its lower edge doubled)."""
    if not 0 <= bucket < NUM_BUCKETS:
        raise ValueError(f"bucket index must be in [0, {NUM_BUCKETS - 1}], got {bucket}")
    return 1 << bucket


def bucket_label(bucket: int) -> str:
    """Label used in metrics and the API: the bucket's upper bound as a string ("1", "2", "4", ...)."""
    return str(bucket_upper_bound(bucket))


def bucket_from_upper_bound(bound: int) -> int:
    """Inverse of bucket_upper_bound: 1 -> 0, 2 -> 1, 4 -> 2, ... Rejects anything else."""
    if bound < 1 or bound & (bound - 1) or bound.bit_length() - 1 >= NUM_BUCKETS:
        raise ValueError(
            f"bucket {bound} is not a bucket upper bound: expected a power of two from 1 to {1 << (NUM_BUCKETS - 1)}"
        )
    return bound.bit_length() - 1


@dataclass(frozen=True)
class ModeTable:
    """Mode per batch-size bucket. Immutable; encode() packs it into 32 bits (2 bits per bucket)."""

    modes: tuple[Mode, ...]

    def __post_init__(self) -> None:
        if len(self.modes) != NUM_BUCKETS:
            raise ValueError(f"a mode table has {NUM_BUCKETS} buckets, got {len(self.modes)}")
        for m in self.modes:
            if m not in tuple(IMPLEMENTED):
                raise ValueError(f"mode code {int(m)} is not a mode: expected one of "
                                 f"{', '.join(f'{int(x)} ({x.label})' for x in IMPLEMENTED)}")
        object.__setattr__(self, "modes", tuple(Mode(m) for m in self.modes))

    @classmethod
    def uniform(cls, mode: Mode) -> ModeTable:
        return cls((mode,) * NUM_BUCKETS)

    def mode_for_rows(self, rows: int) -> Mode:
        return self.modes[bucket_of(rows)]

    def with_buckets(self, mode: Mode, buckets: Iterable[int] | None = None) -> ModeTable:
        """A copy with `mode` set on the given bucket indices (all buckets when None)."""
        modes = list(self.modes)
        for b in range(NUM_BUCKETS) if buckets is None else buckets:
            if not 0 <= b < NUM_BUCKETS:
                raise ValueError(f"bucket index must be in [0, {NUM_BUCKETS - 1}], got {b}")
            modes[b] = mode
        return ModeTable(tuple(modes))

    def encode(self) -> int:
        word = 0
        for b, m in enumerate(self.modes):
            word |= int(m) << (BITS_PER_BUCKET * b)
        return word

    @classmethod
    def decode(cls, word: int) -> ModeTable:
        if not 0 <= word < 1 << (BITS_PER_BUCKET * NUM_BUCKETS):
            raise ValueError(f"table word out of range: {word:#x}")
        mask = (1 << BITS_PER_BUCKET) - 1
        codes = tuple((word >> (BITS_PER_BUCKET * b)) & mask for b in range(NUM_BUCKETS))
        # Raw codes on purpose: __post_init__ rejects one that is no mode (3) with its own message, and
        # converts the rest to Mode.
        return cls(cast("tuple[Mode, ...]", codes))

    def as_labels(self) -> dict[str, str]:
        """{"1": "all_gather", "2": "gather", ...}: the form the HTTP API and YAML use."""
        return {bucket_label(b): m.label for b, m in enumerate(self.modes)}

    @classmethod
    def from_labels(cls, labels: dict[str, str], default: Mode = Mode.ALL_GATHER) -> ModeTable:
        modes = [default] * NUM_BUCKETS
        for bound, mode in labels.items():
            modes[bucket_from_upper_bound(int(bound))] = Mode.parse(mode)
        return cls(tuple(modes))

    def __str__(self) -> str:
        return " ".join(f"{bucket_label(b)}:{_LETTER[m]}" for b, m in enumerate(self.modes))


_LETTER = {Mode.ALL_GATHER: "A", Mode.GATHER: "G", Mode.SHARDED: "S"}


# Control word layout, least significant bit first:
#   bits  0..31  table   (2 bits per bucket)
#   bits 32..55  epoch   (24 bits, wraps; +1 each time rank 0 adopts a new table)
#   bits 56..59  reserved: written 0, ignored on read (earlier releases set bit 0 when the sidecar's policy was
#                auto; nothing ever read it, so it carries no meaning in either direction)
#   bits 60..63  version (CONTROL_WORD_VERSION)
TABLE_BITS = NUM_BUCKETS * BITS_PER_BUCKET  # 32
EPOCH_BITS = 24
RESERVED_BITS = 4
EPOCH_SHIFT = TABLE_BITS
VERSION_SHIFT = EPOCH_SHIFT + EPOCH_BITS + RESERVED_BITS  # 60
EPOCH_MASK = (1 << EPOCH_BITS) - 1


@dataclass(frozen=True)
class ControlWord:
    table: ModeTable
    epoch: int = 0

    def pack(self) -> int:
        """The word as an unsigned 64-bit int."""
        return (
            self.table.encode()
            | (self.epoch & EPOCH_MASK) << EPOCH_SHIFT
            | CONTROL_WORD_VERSION << VERSION_SHIFT
        )

    def pack_signed(self) -> int:
        """The same 64 bits as a signed int64, the form a torch.int64 element holds."""
        word = self.pack()
        return word - (1 << 64) if word >= 1 << 63 else word

    @classmethod
    def unpack(cls, word: int) -> ControlWord:
        word &= (1 << 64) - 1
        version = word >> VERSION_SHIFT
        if version != CONTROL_WORD_VERSION:
            raise ValueError(f"control word version {version} != {CONTROL_WORD_VERSION} (word {word:#018x})")
        return cls(
            table=ModeTable.decode(word & ((1 << TABLE_BITS) - 1)),
            epoch=(word >> EPOCH_SHIFT) & EPOCH_MASK,
        )


def parse_buckets(bounds: Sequence[int] | None) -> list[int] | None:
    """Bucket upper bounds as the API takes them ([1, 2, 4]) -> bucket indices; None means all."""
    if bounds is None:
        return None
    return [bucket_from_upper_bound(int(b)) for b in bounds]
