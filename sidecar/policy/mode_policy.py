"""The sidecar's mode policy (ModePolicy): manual pins where set; elsewhere the auto choice: per bucket, run the
mode whose calls cost least (what a call costs is sidecar.policy.call_costs': its step by default, `policy.cost`).

Pure decision logic, no I/O: the sidecar's loop feeds it samples (`observe`) and the monotonic time of every
call (`now`), and writes whatever `desired_table()` says into the control block. The only clock it reads is
`wall_clock` (unix seconds), to stamp its decisions. It chooses among any number of modes (`modes`, default every
implemented one). This class only composes the parts, each readable and testable alone:
- what each bucket's calls measured: sidecar.policy.bucket_traffic;
- the auto choice from paired evidence, and when a bucket may switch: sidecar.policy.auto_choice;
- probes, their budget and back-off: sidecar.policy.probes, probe_budget, probe_backoff;
- operator pins: sidecar.policy.pins; the decision log: sidecar.policy.decision_log;
- what survives a restart: sidecar.policy.saved_state.
A call is charged to the mode its table named (a call that stepped aside from sharded to the engine's all_gather
is what sharded costs that kind of call), and its kind (gatherwise.call_kind) keeps pairs from mixing kinds.
A pinned bucket (manual `PUT /v1/mode <mode>`) is never touched; `auto` releases the pin (back to the policy's
own choice when its fresh probes had found the pinned mode slower, else from the pinned mode).
Every decision is returned with its evidence, and kept in a bounded log.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from gatherwise.call_kind import split_tag
from gatherwise.config import PolicyParams
from gatherwise.modes import IMPLEMENTED, NUM_BUCKETS, Mode, ModeTable, bucket_label
from gatherwise.sidecar.policy.auto_choice import AutoChoice
from gatherwise.sidecar.policy.bucket_traffic import BucketTraffic
from gatherwise.sidecar.policy.decision_log import Decision, DecisionLog
from gatherwise.sidecar.policy.estimates import KindMix, WindowEstimates
from gatherwise.sidecar.policy.paired_evidence import Evidence, Pair
from gatherwise.sidecar.policy.pins import Pins, chosen_buckets
from gatherwise.sidecar.policy.probes import Probe, Probes


class ModePolicy:
    """The mode of every bucket: a manual pin where one is set (`pin`, `release`), the auto choice elsewhere."""

    def __init__(self, params: PolicyParams, table: ModeTable, *, auto: bool,
                 modes: Sequence[Mode] | None = None, wall_clock: Callable[[], float] = time.time) -> None:
        self.params = params
        self.modes: tuple[Mode, ...] = tuple(IMPLEMENTED if modes is None else modes)
        # one set of measurements, read by both the choice and the probes: a probe is compared with the same
        # windows the choice is made from
        self.traffic = BucketTraffic(params, self.modes)
        self.auto_choice = AutoChoice(params, self.modes, table, self.traffic)
        self.probes = Probes(params, self.modes, self.traffic)
        self.pinned = Pins({} if auto else dict(enumerate(table.modes)))
        self.log = DecisionLog(wall_clock)
        self.restored_extra: dict[str, Any] = {}  # what the control session saved with it (policy_state)

    def set_params(self, params: PolicyParams) -> None:
        # each part keeps the parameters it reads (so it can be built and tested alone): all get the new ones
        self.params = self.auto_choice.params = self.probes.params = params
        self.traffic.resize(params)

    # -- views ---------------------------------------------------------------------------------------------
    @property
    def policy_label(self) -> str:
        return self.pinned.label

    def learned_table(self) -> ModeTable:
        """The table without any probe: pins, and the policy's choice elsewhere."""
        return self.pinned.over(self.choice)

    def desired_table(self) -> ModeTable:
        table = self.learned_table()
        probe = self.probe
        if probe is not None:
            table = table.with_buckets(probe.mode, [probe.bucket])
        return table

    @property
    def probe_share(self) -> float:
        """Share of calls that ran a mode other than the policy's choice (probes)."""
        return self.probes.call_share

    @property
    def probe_cost_share(self) -> float:
        """Seconds probes added, as a share of all seconds observed: what probe_budget bounds."""
        return self.probes.cost_share

    def probe_interval(self, bucket: int, mode: Mode) -> float:
        return self.probes.interval(bucket, mode)

    @property
    def pairs_needed(self) -> int:
        return self.auto_choice.pairs_needed

    def paired_evidence(self, bucket: int, mode: Mode, now: float) -> Evidence | None:
        return self.auto_choice.paired_evidence(bucket, mode, now)

    def paired_ratio(self, bucket: int, mode: Mode, now: float) -> tuple[int, float] | None:
        return self.auto_choice.paired_ratio(bucket, mode, now)

    def evidence(self, bucket: int, now: float) -> dict[str, Any]:
        return self.auto_choice.evidence(bucket, now)

    # The parts' state under the names the control API, the schedule and the tests read.
    @property
    def pins(self) -> dict[int, Mode]:
        """bucket -> the mode it is pinned to."""
        return self.pinned.modes

    @property
    def choice(self) -> list[Mode]:
        return self.auto_choice.choice

    @property
    def last_switch(self) -> dict[int, float]:
        return self.auto_choice.last_switch

    @property
    def pairs(self) -> dict[int, deque[Pair]]:
        return self.auto_choice.pairs

    @property
    def estimates(self) -> WindowEstimates:
        return self.traffic.estimates

    @property
    def kind_estimates(self) -> WindowEstimates:
        return self.traffic.kind_estimates

    @property
    def mix(self) -> dict[int, KindMix]:
        return self.traffic.mix

    @property
    def probe(self) -> Probe | None:
        return self.probes.probe

    @property
    def last_probe(self) -> dict[tuple[int, Mode], float]:
        return self.probes.last_probe

    @property
    def last_probe_end(self) -> dict[int, float]:
        return self.probes.last_probe_end

    @property
    def backoff(self) -> dict[tuple[int, Mode], float]:
        return self.probes.backoff.factors

    @property
    def backoff_reference(self) -> dict[int, float]:
        return self.probes.backoff.reference

    @property
    def calls_total(self) -> int:
        return self.probes.budget.calls_total

    @property
    def probe_calls_used(self) -> int:
        return self.probes.budget.probe_calls_used

    @property
    def seconds_total(self) -> float:
        return self.probes.budget.seconds_total

    @property
    def probe_extra_seconds(self) -> float:
        return self.probes.budget.probe_extra_seconds

    @property
    def decisions(self) -> deque[Decision]:
        return self.log.decisions

    @property
    def next_decision_id(self) -> int:
        return self.log.next_id

    # -- input ---------------------------------------------------------------------------------------------
    def observe(self, mode: Mode, bucket: int, seconds: float, now: float, tag: int = 0) -> bool:
        """One joined call of `bucket` that ran `mode`; `tag` says its kind and the mode its table named
        (gatherwise.call_kind; 0 when the engine does not say: then it counts as the mode that ran). True when
        it ended the running probe (the caller may step at once, so a probe costs no more calls than it needs,
        however long the loop waits between steps)."""
        if not math.isfinite(seconds) or seconds < 0:
            return False
        kind, table_mode = split_tag(tag)
        named = mode if table_mode is None or table_mode not in Mode._value2member_map_ else Mode(table_mode)
        self.traffic.add(bucket, mode, named, kind, seconds, now)
        return self.probes.observe(bucket, named, kind, seconds, now, running=self.choice[bucket],
                                   pinned=bucket in self.pins)

    def pin(self, mode: Mode, buckets: list[int] | None, now: float) -> Decision:
        chosen = chosen_buckets(buckets)
        current = self.desired_table()
        previous = {b: current.modes[b] for b in chosen}
        self.pinned.pin(mode, chosen)
        probe = self.probe
        if probe is not None and probe.bucket in self.pins:
            self.probes.cancel()
        return self.log.record("manual", mode.label, chosen, previous,
                               {"pinned": [bucket_label(b) for b in chosen]})

    def release(self, buckets: list[int] | None, now: float) -> Decision:
        """`auto` for these buckets: drop their pins. A bucket goes back to the mode the policy ran there before
        the pin when its paired probes had already found the pinned mode slower than that one (the evidence of
        the switch it made, still fresh: learning it again would cost probes at the pinned mode's price);
        otherwise the policy continues from the pinned mode. Probe back-off is kept where the bucket runs the
        mode it ran before the pin (its factors measured modes against that one) and reset where it now runs
        another."""
        chosen = chosen_buckets(buckets)
        previous, returned = {}, {}
        for b in chosen:
            pinned = self.pinned.release(b)
            if pinned is None:
                continue
            previous[b] = pinned
            found = self.paired_evidence(b, pinned, now) if pinned != self.choice[b] else None
            if found is not None and found.ratio > 1.0 + self.params.margin and (
                    found.slower or found.probes >= self.pairs_needed):
                returned[bucket_label(b)] = self.choice[b].label  # fresh probes found the pin slower
            elif pinned != self.choice[b]:
                self.choice[b] = pinned
                self.probes.backoff.reset(b)
        return self.log.record("manual", "auto", chosen, previous,
                               {"released": [bucket_label(b) for b in chosen], "returned": returned})

    def adopt_table(self, table: ModeTable, now: float, source: str) -> Decision | None:
        """Start auto buckets from a learned table (policy.table_file)."""
        changed = [b for b in range(NUM_BUCKETS) if b not in self.pins and self.choice[b] != table.modes[b]]
        decision = None
        for mode in self.modes:
            bs = [b for b in changed if table.modes[b] == mode]
            if bs:
                previous = {b: self.choice[b] for b in bs}
                for b in bs:
                    self.choice[b] = mode
                    self.probes.backoff.reset(b)
                decision = self.log.record("table_file", mode.label, bs, previous, {"source": source})
        return decision

    def step(self, now: float) -> list[Decision]:
        """End a finished probe, switch buckets whose evidence says so, maybe start a probe."""
        out: list[Decision] = []
        if self.probes.due_to_end(now):
            probe = self.probes.finish(now)
            ratio = self.auto_choice.record_probe(probe.bucket, probe.mode, probe.samples, probe.references, now)
            chosen = self.traffic.running_estimate(probe.bucket, self.choice[probe.bucket], now)
            found = self.paired_evidence(probe.bucket, probe.mode, now)
            settled_slower = found is not None and found.slower and found.ratio > 1.0 + self.params.margin
            backoff = self.probes.after_probe(probe, ratio, chosen, settled_slower)
            out.append(self.log.record("probe", self.choice[probe.bucket].label, [probe.bucket],
                                       {probe.bucket: probe.mode},
                                       {"phase": "end", "probe_calls": probe.calls, "backoff": backoff,
                                        **self.evidence(probe.bucket, now)}))
        for b in range(NUM_BUCKETS):
            if b in self.pins or (self.probe is not None and self.probe.bucket == b):
                continue
            active = self.choice[b]
            self.probes.watch_load(b, self.traffic.running_estimate(b, active, now))
            if self.auto_choice.dwelling(b, now):
                continue
            best = self.auto_choice.challenger(b, now)
            if best is not None:
                evidence = self.evidence(b, now)
                self.auto_choice.switch(b, best, now)
                self.probes.backoff.reset(b)
                out.append(self.log.record("auto", best.label, [b], {b: active}, evidence))
        if self.probe is None:
            started = self._start_probe(now)
            if started is not None:
                out.append(started)
        return out

    def _start_probe(self, now: float) -> Decision | None:
        probe = self.probes.start_next([b for b in range(NUM_BUCKETS) if b not in self.pins], self.auto_choice, now)
        if probe is None:
            return None
        b, mode = probe.bucket, probe.mode
        return self.log.record("probe", mode.label, [b], {b: self.choice[b]},
                               {"phase": "start", "probe_calls": self.params.probe_calls,
                                "probe_share": self.probe_share, "probe_cost_share": self.probe_cost_share,
                                "backoff": self.probes.backoff.factor(b, mode), **self.evidence(b, now)})
