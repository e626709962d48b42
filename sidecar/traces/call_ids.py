"""The ids of a call's trace, derived from (engine instance id, call index), so that every node's sidecar puts its
spans of one call into the same trace without ever talking to another.

The engine id is the same on every node (rank 0 draws it at each start and broadcasts it) and new at every start,
and the call index is the same on every rank, so the pair names one call of one engine lifetime everywhere. The
trace id and the root span's id come from the pair alone; a child span's id adds the rank and the operation, so
the spans of different ranks (on whichever node) never share an id. Ids are keyed BLAKE2b digests: the same on
every host and in every process, never from an RNG someone else may seed.
"""

from __future__ import annotations

import hashlib
import os
import random

from opentelemetry.sdk.trace.id_generator import IdGenerator

_TRACE, _ROOT, _CHILD = b"gw-trace", b"gw-root", b"gw-span"  # BLAKE2b personalisation: one domain per kind of id


def _digest(kind: bytes, bits: int, *parts: int | str) -> int:
    data = b"\0".join(str(p).encode() for p in parts)
    value = int.from_bytes(hashlib.blake2b(data, digest_size=bits // 8, person=kind).digest(), "little")
    return value or 1  # 0 is the invalid id


def call_trace_id(engine_id: int, call_index: int) -> int:
    """The 128-bit trace id of a call."""
    return _digest(_TRACE, 128, engine_id, call_index)


def call_root_span_id(engine_id: int, call_index: int) -> int:
    """The 64-bit id of the call's root span (`logits.call`), which the other nodes' spans name as their parent."""
    return _digest(_ROOT, 64, engine_id, call_index)


def call_span_id(engine_id: int, call_index: int, rank: int, op: str) -> int:
    """The 64-bit id of one rank's span of one operation in the call."""
    return _digest(_CHILD, 64, engine_id, call_index, rank, op)


class CallIdGenerator(IdGenerator):
    """Hands the SDK the ids the tracer derived for the span it starts next (`next_ids`), else random ones from a
    private RNG seeded from os.urandom (spans that are no call's, e.g. mode switches: random per process even when
    someone seeds the global `random` module, as TP ranks and tests do; the SDK default draws from it). The
    sidecar's spans are started on its one loop thread, so an id set is the next span's."""

    def __init__(self) -> None:
        self._rng = random.Random(os.urandom(32))
        self._trace_id: int | None = None
        self._span_id: int | None = None

    def next_ids(self, span_id: int, trace_id: int | None = None) -> None:
        """The ids of the next span started (a trace id only matters for a span without a parent)."""
        self._span_id, self._trace_id = span_id, trace_id

    def generate_span_id(self) -> int:
        found, self._span_id = self._span_id, None
        return found if found is not None else self._rng.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        found, self._trace_id = self._trace_id, None
        return found if found is not None else self._rng.getrandbits(128) or 1
