"""What probes cost, against what `probe_budget` allows. Pure arithmetic, no I/O.

Probes cost what they add: the budget bounds the seconds probe calls took beyond what the running mode would
have taken for them (same bucket, same kind), as a share of all seconds observed, counted per probe net of its
calls. On a noisy host half of an equal mode's calls run over the running median and half under, and charging
only the ones over spent the budget on noise before a faster mode could be confirmed. A probe of a faster mode
is free; one of a slower mode ends the moment the budget is spent, however slow its calls.
"""

from __future__ import annotations


class ProbeBudget:
    """Calls and seconds observed, and what probes took of them."""

    def __init__(self) -> None:
        self.calls_total = 0
        self.probe_calls_used = 0  # calls that ran a mode other than the policy's choice
        self.seconds_total = 0.0
        self.probe_extra_seconds = 0.0  # what ended probes took beyond the running mode's cost (net, >= 0)

    def count_call(self, seconds: float) -> None:
        self.calls_total += 1
        self.seconds_total += seconds

    def count_probe_call(self) -> None:
        self.probe_calls_used += 1

    def charge(self, extra: float) -> None:
        """Seconds an ended probe (net of its calls), or a call outside any probe, took beyond the running mode's
        cost; a net saving charges nothing and earns nothing."""
        self.probe_extra_seconds += max(0.0, extra)

    def charged(self, open_extra: float | None) -> float:
        """What probes added so far: ended probes' net extra, and the running probe's (`open_extra`, None when
        no probe runs) once it is positive."""
        return self.probe_extra_seconds + (max(0.0, open_extra) if open_extra is not None else 0.0)

    def over(self, budget: float, open_extra: float | None) -> bool:
        """Probes took more than `budget` (a share) of all seconds observed."""
        return self.charged(open_extra) > budget * self.seconds_total

    @property
    def call_share(self) -> float:
        """Share of calls that ran a mode other than the policy's choice (probes)."""
        return self.probe_calls_used / self.calls_total if self.calls_total else 0.0

    def cost_share(self, open_extra: float | None) -> float:
        """Seconds probes added, as a share of all seconds observed: what probe_budget bounds."""
        return self.charged(open_extra) / self.seconds_total if self.seconds_total > 0 else 0.0
