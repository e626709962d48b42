"""A call the record of every rank read here arrived for: what ingest hands the policy (gatherwise.sidecar.ingest.poll
joins it)."""

from __future__ import annotations

from typing import NamedTuple

from gatherwise.sidecar.ingest.attached_engine import AttachedEngine


class JoinedCall(NamedTuple):
    """A call the record of every rank read here arrived for: what the policy learns from."""

    engine: AttachedEngine
    call_index: int
    mode: int  # mode code
    bucket: int
    # What the call cost the logits path: the critical path (last rank in to last rank holding its tokens) when
    # every rank is read; on one node of a multi-node group, rank 0's path where that node holds it (it includes
    # waiting for the other nodes' shards; their clocks are not comparable), else the node-local critical path.
    seconds: float
    tag: int  # call kind (gatherwise.call_kind)
    # Start of the lowest rank read (rank 0 wherever the policy runs), on its clock: the next call's start minus
    # this one is the call's step.
    start_ns: int
