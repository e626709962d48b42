"""What a joined call costs its mode, as the policy compares modes (`policy.cost`).

`path`: the call's critical path (sidecar.ingest), known as soon as the call is joined. `step`: the time from
the call's start to the next call's start on rank 0's clock: the logits path plus whatever the mode does to the
rest of the engine's step. A mode can shorten the path and lengthen the step (on a CPU host whose TP ranks share
cores, idle OpenMP workers of one rank spin on the core the other rank needs: docs/BENCHMARKS.md), and only the
step shows that. A call's step is known once the next call is joined, so under `step` the policy learns each
call one call late; a call whose successor is not the next joined call (a call missing, another engine) teaches
nothing. A gap in which the engine idled is part of a step too: it does not depend on the mode, and the
policy's medians and paired evidence set such outliers aside.
"""

from __future__ import annotations

from gatherwise.sidecar.ingest import JoinedCall


class CallCosts:
    """One engine's joined calls in order -> (call, seconds it cost its mode)."""

    def __init__(self) -> None:
        self.previous: JoinedCall | None = None  # kept under `path` too, so a switch to `step` costs no call

    def cost(self, call: JoinedCall, kind: str) -> tuple[JoinedCall, float] | None:
        """The call the policy learns now and its cost: under `path` this call, under `step` the previous
        one, once this one shows where its step ended (None when there is none)."""
        previous, self.previous = self.previous, call
        if kind == "path":
            return call, call.seconds
        if previous is None or previous.engine is not call.engine or call.call_index != previous.call_index + 1:
            return None
        return previous, max(previous.seconds, (call.start_ns - previous.start_ns) * 1e-9)
