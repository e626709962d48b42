"""A call every rank's record arrived for: what ingest hands the policy (gatherwise.sidecar.ingest.poll joins it)."""

from __future__ import annotations

from typing import NamedTuple

from gatherwise.sidecar.ingest.attached_engine import AttachedEngine


class JoinedCall(NamedTuple):
    """A call every rank's record arrived for: what the policy learns from."""

    engine: AttachedEngine
    call_index: int
    mode: int  # mode code
    bucket: int
    seconds: float  # critical path: last rank in to last rank holding its tokens
    tag: int  # call kind (gatherwise.call_kind)
    start_ns: int  # rank 0's start (its clock): the next call's start minus this one is the call's step
