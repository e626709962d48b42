"""What a joined call costs its mode, as the policy compares modes (`policy.cost`).

`path`: the call's critical path (sidecar.ingest), known as soon as the call is joined. `step`: the time from
the call's start to the next call's start on rank 0's clock: the logits path plus whatever the mode does to the
rest of the engine's step. A mode can shorten the path and lengthen the step (on a CPU host whose TP ranks share
cores, idle OpenMP workers of one rank spin on the core the other rank needs: docs/BENCHMARKS.md), and only the
step shows that. A call's step is known once the next call is joined, so under `step` the policy learns each
call one call late; a call whose successor is not the next joined call (a call missing, another engine) teaches
nothing. The engine may idle between two calls (no request to run): a step's part outside the path (its rest)
counts at most REST_CAP times the median rest of the engine's recent calls. Uncapped, one idle gap after a
probe call charged the probe with seconds of idle time and spent the whole probe budget; capped, a mode whose
rest is really longer still shows as up to REST_CAP times slower, never as free. Until MIN_RESTS rests give a
median there is nothing to cap against, so those first steps teach nothing (they only fill the window): the
gap between an engine's warm-up request and its first traffic, charged in full, once made auto adopt a mode
for a bucket from one probe whose reference held it.
"""

from __future__ import annotations

from collections import deque
from statistics import median

from gatherwise.sidecar.ingest.joined_call import JoinedCall

REST_CAP = 4.0  # a step's rest counts at most this many times the recent median rest
REST_WINDOW = 64  # recent rests kept (every bucket and mode)
MIN_RESTS = 8  # rests seen before the cap applies
CAP_EVERY = 8  # rests between two recomputations of the cap (a median of the window per call costs CPU)


class CallCosts:
    """One engine's joined calls in order -> (call, seconds it cost its mode)."""

    def __init__(self) -> None:
        self.previous: JoinedCall | None = None  # kept under `path` too, so a switch to `step` costs no call
        self.rests: deque[float] = deque(maxlen=REST_WINDOW)  # recent rests, as capped
        self.rest_cap = float("inf")
        self.until_cap = MIN_RESTS  # rests to go before the cap is recomputed

    def charge(self, call: JoinedCall, cost: str) -> tuple[JoinedCall, float] | None:
        """The call the policy learns now and its cost: under `path` this call, under `step` the previous
        one, once this one shows where its step ended (None when there is none)."""
        previous, self.previous = self.previous, call
        if cost == "path":
            return call, call.seconds
        if previous is None or previous.engine is not call.engine or call.call_index != previous.call_index + 1:
            return None
        capped = self.rest_cap != float("inf")
        rest = min(max(0.0, (call.start_ns - previous.start_ns) * 1e-9 - previous.seconds), self.rest_cap)
        self.rests.append(rest)
        self.until_cap -= 1
        if self.until_cap <= 0:
            self.rest_cap, self.until_cap = REST_CAP * median(self.rests), CAP_EVERY
        return (previous, previous.seconds + rest) if capped else None
