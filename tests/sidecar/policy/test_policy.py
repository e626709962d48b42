"""Auto policy logic fed synthetic costs: switching, hysteresis, dwell, probes and their budget, pins."""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Callable
from pathlib import Path

import pytest

from gatherwise.modes import NUM_BUCKETS, Mode, ModeTable, bucket_of
from gatherwise.sidecar.policy.auto_choice import should_switch
from gatherwise.sidecar.policy.decision_log import Decision
from gatherwise.sidecar.policy.estimates import Estimate, WindowEstimates
from gatherwise.sidecar.policy.mode_policy import ModePolicy, PolicyParams
from gatherwise.sidecar.policy.saved_state import MAX_STATE_BYTES, policy_from_json, policy_to_json, state_text

A, G = Mode.ALL_GATHER, Mode.GATHER
TWO = (A, G)  # tests whose costs tell only these two apart; three-mode tests pass their own list
FAST = PolicyParams(margin=0.05, min_samples=10, window=64, dwell_seconds=0.5, probe_interval_seconds=0.2,
                    probe_calls=8, probe_budget=0.1, max_sample_age_seconds=3.0)


def fast(**changes: float) -> PolicyParams:
    """FAST with some parameters changed, validated like any other parameters."""
    return PolicyParams.model_validate({**FAST.model_dump(), **changes})


def est(p50: float, samples: int = 50) -> Estimate:
    return Estimate(samples, p50, p50, p50, 0.0)


def test_should_switch_needs_margin_and_samples_on_both_sides():
    params = PolicyParams(margin=0.1, min_samples=30)
    assert should_switch(est(1.0), est(0.85), params)
    assert not should_switch(est(1.0), est(0.95), params)  # inside the margin: hysteresis
    assert not should_switch(est(1.0), est(0.5, samples=29), params)
    assert not should_switch(est(1.0, samples=29), est(0.5), params)
    assert not should_switch(None, est(0.5), params) and not should_switch(est(1.0), None, params)


def test_summarize_and_window_age_out():
    five = WindowEstimates(window=8, max_age_seconds=10.0)
    for v in (5.0, 1.0, 3.0, 2.0, 4.0):
        five.add(0, A, v, now=0.0)
    s = five.get(0, A, now=0.5)
    assert s is not None
    assert (s.samples, s.p50, s.mean, s.age_seconds) == (5, 3.0, 3.0, 0.5)
    assert math.isclose(s.p90, 4.6)
    w = WindowEstimates(window=4, max_age_seconds=10.0)
    for i in range(6):
        w.add(0, A, float(i), now=float(i))
    full, aged = w.get(0, A, now=5.0), w.get(0, A, now=13.5)
    assert full is not None and full.samples == 4  # window
    assert aged is not None and aged.samples == 2  # samples from t=4 and t=5 are younger than 10 s
    assert w.get(0, G, now=5.0) is None


def simulate(policy: ModePolicy, cost: Callable[[int, Mode, float], float], seconds: float, now: float,
             rows: tuple[int, ...] = (1,), calls_per_second: float = 1000, step_every: int = 20) -> tuple[float, list]:
    """Run calls at a fixed rate; each call's cost = cost(bucket_mode, now); step the policy like a sidecar."""
    decisions = []
    dt = 1.0 / calls_per_second
    for i in range(int(seconds * calls_per_second)):
        r = rows[i % len(rows)]
        mode = policy.desired_table().mode_for_rows(r)
        policy.observe(mode, bucket_of(r), cost(r, mode, now), now)
        if i % step_every == 0:
            decisions += policy.step(now)
        now += dt
    return now, decisions


def delay_on(slow: Mode) -> Callable[[int, Mode, float], float]:
    return lambda rows, mode, now: 0.002 if mode == slow else 0.001


def test_auto_converges_and_moves_back_when_the_delay_moves():
    policy = ModePolicy(FAST, ModeTable.uniform(G), auto=True, modes=TWO)
    now, decisions = simulate(policy, delay_on(G), 4.0, 0.0, rows=(1, 8))
    assert policy.choice[0] == A and policy.choice[3] == A
    auto = [d for d in decisions if d.reason == "auto"]
    assert {tuple(d.buckets) for d in auto} == {("1",), ("8",)}
    ev = auto[0].evidence["estimates"]
    assert ev["all_gather"]["p50"] < ev["gather"]["p50"] and ev["all_gather"]["samples"] >= 10
    now, decisions = simulate(policy, delay_on(A), 6.0, now, rows=(1, 8))
    assert policy.choice[0] == G and policy.choice[3] == G
    assert policy.probe_calls_used <= FAST.probe_budget * policy.calls_total + FAST.probe_calls
    assert all(policy.choice[b] == G for b in range(NUM_BUCKETS) if b not in (0, 3))  # untouched buckets


def test_probes_respect_budget_and_interval():
    params = fast(probe_budget=0.02)
    policy = ModePolicy(params, ModeTable.uniform(A), auto=True, modes=TWO)
    _, decisions = simulate(policy, delay_on(G), 10.0, 0.0)
    starts = [d for d in decisions if d.reason == "probe" and d.evidence["phase"] == "start"]
    assert starts and policy.choice[0] == A
    assert policy.probe_share <= 0.02 + params.probe_calls / policy.calls_total
    assert all(d.evidence["probe_calls"] == params.probe_calls for d in starts)


def test_no_budget_means_no_probes_and_no_switch_without_evidence():
    params = fast(probe_budget=0.0)
    policy = ModePolicy(params, ModeTable.uniform(G), auto=True, modes=TWO)
    _, decisions = simulate(policy, delay_on(G), 2.0, 0.0)
    assert decisions == [] and policy.choice[0] == G and policy.probe_calls_used == 0


def test_dwell_blocks_a_second_switch():
    params = fast(dwell_seconds=100.0)
    policy = ModePolicy(params, ModeTable.uniform(G), auto=True, modes=TWO)
    now, _ = simulate(policy, delay_on(G), 3.0, 0.0)
    assert policy.choice[0] == A
    now, decisions = simulate(policy, delay_on(A), 5.0, now)
    assert policy.choice[0] == A and not [d for d in decisions if d.reason == "auto"]


def test_pins_override_auto_and_release_resumes():
    policy = ModePolicy(FAST, ModeTable.uniform(A), auto=True, modes=TWO, wall_clock=lambda: 1234.5)
    d = policy.pin(G, [0], now=0.0)
    assert (d.reason, d.mode, d.buckets, d.previous) == ("manual", "gather", ["1"], {"1": "all_gather"})
    assert d.time == 1234.5  # decisions are stamped by the policy's own wall clock
    assert policy.policy_label == "mixed" and policy.desired_table().modes[0] == G
    now, decisions = simulate(policy, delay_on(G), 3.0, 0.0)
    assert policy.desired_table().modes[0] == G and not [x for x in decisions if "1" in x.buckets]
    d = policy.release([0], now)
    assert (d.reason, d.mode, d.buckets, d.previous) == ("manual", "auto", ["1"], {"1": "gather"})
    assert policy.policy_label == "auto"
    simulate(policy, delay_on(G), 3.0, now)
    assert policy.desired_table().modes[0] == A


def test_release_returns_to_the_policys_choice_when_probes_found_the_pin_slower():
    """Pinned to a mode the policy had measured as slower, `auto` goes straight back to its own choice; pinned to
    a mode it has no paired evidence against, it continues from the pin and learns."""
    policy = ModePolicy(FAST, ModeTable.uniform(A), auto=True, modes=TWO)
    now, _ = simulate(policy, delay_on(G), 3.0, 0.0)  # probes of gather while all_gather runs: gather 2x slower
    found = policy.paired_ratio(0, G, now)
    assert policy.choice[0] == A and found is not None and found[0] >= policy.pairs_needed and found[1] > 1.5
    backed_off = dict(policy.backoff)
    assert backed_off.get((0, G), 1.0) > 1.0  # gather's probes were backed off
    policy.pin(G, None, now)
    d = policy.release(None, now + 0.5)
    assert policy.desired_table().modes[0] == A and d.evidence["returned"] == {"1": "all_gather"}
    assert policy.backoff == backed_off  # back to the mode its factors were measured against: kept
    assert policy.desired_table().modes[5] == G  # bucket 32 never ran: no evidence, it continues from the pin
    policy.pin(G, [0], now + 1.0)
    later = now + 1.0 + FAST.max_sample_age_seconds + 1
    d = policy.release([0], later)  # the evidence has aged out meanwhile: continue from the pin
    assert policy.desired_table().modes[0] == G and d.evidence["returned"] == {}
    assert not [key for key in policy.backoff if key[0] == 0]  # now running another mode: reset


def test_manual_policy_pins_everything():
    policy = ModePolicy(FAST, ModeTable.uniform(G), auto=False)
    assert policy.policy_label == "manual"
    _, decisions = simulate(policy, delay_on(G), 2.0, 0.0)
    assert decisions == [] and policy.desired_table() == ModeTable.uniform(G)


def test_state_round_trips_through_json():
    policy = ModePolicy(FAST, ModeTable.uniform(G), auto=True, modes=TWO)
    simulate(policy, delay_on(G), 3.0, 0.0, rows=(1, 8))
    policy.pin(G, [4], 3.0)
    restored = policy_from_json(policy_to_json(policy))
    assert restored.learned_table() == policy.learned_table()
    assert restored.pins == policy.pins and restored.params == policy.params
    assert (restored.calls_total, restored.probe_calls_used) == (policy.calls_total, policy.probe_calls_used)
    assert [d.id for d in restored.decisions] == [d.id for d in policy.decisions]
    assert restored.estimates.get(0, A, 3.0) == policy.estimates.get(0, A, 3.0)
    assert restored.next_decision_id == policy.next_decision_id


@pytest.mark.parametrize("bad", ["{", "[]", '{"version": 99}'])
def test_bad_state_json_is_rejected(bad):
    with pytest.raises(ValueError):
        policy_from_json(bad)


STATE_V2 = Path(__file__).parent / "data" / "sidecar-state-v2.json"  # written by the previous JSON codec


def test_a_state_file_of_the_previous_codec_loads_and_is_written_back_with_everything_it_held():
    """Version 2 (before call kinds): read, its pairs as kind 0 (unknown), and written back as version 3 with
    every version 2 field unchanged (its params gain the ones added since, at their defaults)."""
    text = STATE_V2.read_text()
    restored = policy_from_json(text)
    assert restored.pins == {4: G} and restored.backoff == {(0, G): 16.0, (3, G): 16.0}
    assert len(restored.decisions) == 25 and restored.next_decision_id == 26
    assert restored.restored_extra == {"last_call_index": 5, "switch_counts": {"all_gather|gather|auto": 1}}
    assert [(p.kind, p.ratio) for p in restored.pairs[0]] == [(0, 2.0)]
    old, new = json.loads(text), json.loads(policy_to_json(restored, restored.restored_extra))
    assert new["version"] == 3
    assert {k: v for k, v in new.items() if k in old and k not in ("version", "pairs", "params")} == \
        {k: v for k, v in old.items() if k not in ("version", "pairs", "params")}
    assert new["params"] == {**old["params"], "cost": "step"}
    assert {b: [p[:4] for p in v] for b, v in new["pairs"].items()} == old["pairs"]
    again = policy_from_json(json.dumps(new))
    assert again.pairs == restored.pairs and again.estimates.to_json() == restored.estimates.to_json()


def test_a_state_above_the_cap_is_saved_without_its_sample_windows_and_reads_back():
    """What a sidecar writes it can read: a window large enough to pass MAX_STATE_BYTES leaves the windows out,
    never the pins, parameters or decisions."""
    doc = json.loads(STATE_V2.read_text())
    window = 4096
    doc["params"]["window"] = window
    doc["estimates"] = {f"{b}:{m}": [[1000.0 + i * 0.123456789, 0.000123456789 + i * 1e-9] for i in range(window)]
                        for b in range(NUM_BUCKETS) for m in ("all_gather", "gather")}
    policy = policy_from_json(json.dumps(doc))
    assert len(policy.estimates.to_json()) == 2 * NUM_BUCKETS
    text, trimmed = state_text(policy, policy.restored_extra)
    assert trimmed and len(text.encode()) <= MAX_STATE_BYTES
    again = policy_from_json(text)
    assert again.pins == policy.pins and again.params == policy.params and again.estimates.to_json() == {}
    assert [d.id for d in again.decisions] == [d.id for d in policy.decisions]
    assert state_text(again, again.restored_extra) == (text, False)


@pytest.mark.parametrize(("change", "message"), [
    ({"version": 1}, "state version 1, expected 3"),
    ({"choice": ["scatter"] * NUM_BUCKETS}, "choice.0"),
    ({"choice": ["gather"]}, "choice"),
    ({"pins": {"99": "gather"}}, "pins.99"),
    ({"params": {"margin": -1}}, "params.margin"),
    ({"backoff": {"99:gather": 2.0}}, "bucket 99 out of range"),
    ({"decisions": [{"id": 1}]}, "decisions.0"),
    ({"surprise": 1}, "surprise"),
])
def test_a_damaged_state_file_is_refused_naming_what_is_wrong(change, message):
    doc = {**json.loads(STATE_V2.read_text()), **change}
    if "params" in change:
        doc["params"] = {**json.loads(STATE_V2.read_text())["params"], **change["params"]}
    with pytest.raises(ValueError, match="unreadable sidecar state") as err:
        policy_from_json(json.dumps(doc))
    assert message in str(err.value)


@pytest.fixture
def three_modes(monkeypatch):
    """All three mode codes valid in tables, whether or not this checkout's engine implements sharded yet: the
    policy's N-mode logic is pure and is tested on its own (the engine side has its own tests)."""
    import gatherwise.modes as modes

    monkeypatch.setattr(modes, "IMPLEMENTED", (A, G, S))
    monkeypatch.setattr(modes, "IMPLEMENTED_LABELS", tuple(m.label for m in (A, G, S)))
    return (A, G, S)


S = Mode.SHARDED


def costs(table: dict) -> Callable[[int, Mode, float], float]:
    """rows, mode, now -> seconds from {mode: seconds} (or {mode: callable(rows)})."""
    return lambda rows, mode, now: table[mode](rows) if callable(table[mode]) else table[mode]


def test_three_modes_each_bucket_goes_to_its_fastest(three_modes):
    policy = ModePolicy(FAST, ModeTable.uniform(A), auto=True, modes=three_modes)
    # rows 1: gather fastest; rows 64: sharded fastest; all_gather never
    cost = costs({A: 0.003, G: lambda r: 0.001 if r == 1 else 0.004, S: lambda r: 0.002 if r == 1 else 0.001})
    _, decisions = simulate(policy, cost, 8.0, 0.0, rows=(1, 64))
    assert policy.choice[0] == G and policy.choice[6] == S
    auto = [d for d in decisions if d.reason == "auto"]
    assert auto and set(auto[-1].evidence["estimates"]) == {"all_gather", "gather", "sharded"}
    probed = {(d.buckets[0], d.mode) for d in decisions if d.reason == "probe" and d.evidence["phase"] == "start"}
    assert {m for _, m in probed} >= {"gather", "sharded"}  # every other mode gets probed


def probe_starts(decisions: list[Decision]) -> int:
    return len([d for d in decisions if d.reason == "probe" and d.evidence["phase"] == "start"])


def test_probes_back_off_while_the_other_mode_stays_far_behind():
    """One mode wins everywhere (2x): with back-off the losing mode is probed far less often, and the share of
    calls spent probing falls well below the budget; the choice never changes."""
    runs = {}
    for backoff_max in (1.0, 16.0):
        params = fast(probe_budget=0.05, probe_backoff_margin=0.25, probe_backoff_max=backoff_max)
        policy = ModePolicy(params, ModeTable.uniform(A), auto=True, modes=TWO)
        _, decisions = simulate(policy, delay_on(G), 30.0, 0.0)
        assert policy.choice[0] == A and not [d for d in decisions if d.reason == "auto"]
        runs[backoff_max] = (probe_starts(decisions), policy.probe_share, policy)
    (plain, plain_share, _), (adaptive, adaptive_share, policy) = runs[1.0], runs[16.0]
    assert adaptive * 4 <= plain and adaptive_share * 4 <= plain_share
    assert policy.backoff[(0, G)] == 16.0 and policy.probe_interval(0, G) == 16.0 * FAST.probe_interval_seconds


def test_probes_back_off_a_mode_the_paired_evidence_settles_as_slower_by_more_than_the_margin():
    """A mode 8 % behind is never far behind (25 %), but probe after probe finds it decisively slower by more than
    the switch margin: it backs off all the same. One 2 % behind, inside the margin, is probed at the base
    interval: it is the one a small change of load would make the faster."""
    params = fast(probe_budget=0.05, probe_backoff_margin=0.25, probe_backoff_max=16.0)
    starts = {}
    for slower in (1.08, 1.02):
        policy = ModePolicy(params, ModeTable.uniform(A), auto=True, modes=TWO)
        _, decisions = simulate(policy, costs({A: 0.001, G: 0.001 * slower}), 30.0, 0.0)
        assert policy.choice[0] == A and not [d for d in decisions if d.reason == "auto"]
        starts[slower] = probe_starts(decisions)
        found = policy.paired_evidence(0, G, 30.0)
        assert found is not None and found.slower
        assert policy.backoff.get((0, G), 1.0) == (16.0 if slower == 1.08 else 1.0)
    assert starts[1.08] * 4 <= starts[1.02]


def test_a_load_change_ends_the_back_off_and_the_policy_follows():
    params = fast(probe_budget=0.05, probe_backoff_max=64.0)
    policy = ModePolicy(params, ModeTable.uniform(A), auto=True, modes=TWO)
    now, _ = simulate(policy, delay_on(G), 20.0, 0.0)
    assert policy.backoff.get((0, G), 1.0) >= 16.0  # backed off: next probe of gather is >= 3 s away
    # the load changes: all_gather now costs 3 ms, gather 2 ms. The back-off must not keep gather unmeasured.
    now, decisions = simulate(policy, lambda rows, mode, t: 0.003 if mode == A else 0.002, 4.0, now)
    assert policy.choice[0] == G, [(d.reason, d.mode, d.evidence.get("phase")) for d in decisions]
    assert (0, G) not in policy.backoff


def test_back_off_state_round_trips_through_json():
    policy = ModePolicy(fast(probe_budget=0.05), ModeTable.uniform(A), auto=True, modes=TWO)
    simulate(policy, delay_on(G), 10.0, 0.0)
    assert policy.backoff
    restored = policy_from_json(policy_to_json(policy))
    assert restored.backoff == policy.backoff and restored.last_probe == policy.last_probe
    assert restored.backoff_reference == policy.backoff_reference
    assert restored.pairs == policy.pairs and policy.pairs



@pytest.mark.parametrize("modes", [TWO, (A, G, Mode.SHARDED)], ids=["two modes", "three modes"])
def test_a_load_drift_that_hits_every_mode_alike_causes_no_switch(modes, three_modes):
    """all_gather is 10 % faster at every instant, while the host's load triples the cost of both within 10 s.
    The running mode's window covers the last few ms, the other mode's only its probes over seconds: comparing
    those windows would see the other mode cheaper (it was measured when the load was lower) and switch. Paired
    probe ratios compare the two at the same time and never do."""
    policy = ModePolicy(fast(probe_budget=0.05), ModeTable.uniform(A), auto=True, modes=modes)
    _, decisions = simulate(policy, lambda rows, mode, now: (0.001 if mode == A else 0.0011) * (1.0 + 0.3 * now),
                            10.0, 0.0)
    assert policy.choice[0] == A and not [d for d in decisions if d.reason == "auto"]
    ends = [d for d in decisions if d.reason == "probe" and d.evidence["phase"] == "end"]
    assert ends and all(abs(r["ratio"] - 1.1) < 0.06 for d in ends for r in d.evidence["paired"].values())


def test_one_mode_winning_everywhere_under_noise_and_drift_is_found_and_kept(three_modes):
    """Sharded is ~40 % cheaper at every size; every call's cost is noisy (log-normal, sigma 0.25). Starting from
    all_gather while the load swings every mode's cost by +-50 %, the policy moves every bucket to sharded and
    stays (no switching back and forth on noise or drift). Once the load is steady, probes of the losing modes
    back off and cost a fraction of the budget; a swinging load keeps them at the budget (the load changed)."""
    import random

    rng = random.Random(11)
    base = {A: 0.0012, G: 0.00125, S: 0.0007}
    swing = [0.5]

    def cost(rows, mode, now):
        return base[mode] * rng.lognormvariate(0.0, 0.25) * (1.0 + swing[0] * math.sin(now / 3.0))

    params = fast(probe_budget=0.02, probe_interval_seconds=1.0, max_sample_age_seconds=30.0)
    policy = ModePolicy(params, ModeTable.uniform(A), auto=True, modes=three_modes)
    now, decisions = simulate(policy, cost, 15.0, 0.0, rows=(1, 8, 64))
    assert [policy.choice[b] for b in (0, 3, 6)] == [S, S, S], [(d.buckets, d.mode) for d in decisions
                                                                if d.reason == "auto"]
    now, later = simulate(policy, cost, 30.0, now, rows=(1, 8, 64))
    assert not [d for d in later if d.reason == "auto"]  # kept: no flapping on noise and drift
    swing[0] = 0.0
    now, _ = simulate(policy, cost, 20.0, now, rows=(1, 8, 64))  # the back-off builds up
    used = policy.probe_calls_used
    _, steady = simulate(policy, cost, 30.0, now, rows=(1, 8, 64))
    assert not [d for d in steady if d.reason == "auto"]
    assert (policy.probe_calls_used - used) / 30_000 < 0.005  # budget 0.02


# -- a slow engine: a few calls per second, calls of several kinds ---------------------------------------------
from gatherwise.call_kind import Sampling, call_kind, call_tag  # noqa: E402

GREEDY, TOP_P = call_kind(Sampling.GREEDY), call_kind(Sampling.TOP_P)


def simulate_engine(policy: ModePolicy, cost: Callable[[int, Mode, float], float], calls: int, now: float, *,
                    kinds: tuple[int, ...] = (GREEDY,), rows: int = 32, calls_per_second: float = 2.6,
                    steps_aside: Callable[[int, Mode], Mode] = lambda kind, mode: mode,
                    ) -> tuple[float, list, int | None]:
    """A CPU engine's decode loop: one call every 1/calls_per_second s, kinds in rotation; each call runs what
    its table names unless `steps_aside` says otherwise (as a sharded table's sampled calls run all_gather),
    is recorded with its tag, and the policy steps after it as the sidecar does. Returns the time, the
    decisions and the call after which the last switch of the bucket happened."""
    decisions, switched_at = [], None
    bucket = bucket_of(rows)
    for i in range(calls):
        kind = kinds[i % len(kinds)]
        named = policy.desired_table().mode_for_rows(rows)
        ran = steps_aside(kind, named)
        policy.observe(ran, bucket, cost(kind, ran, now), now, call_tag(kind, int(named)))
        new = policy.step(now)
        if any(d.reason == "auto" for d in new):
            switched_at = i + 1
        decisions += new
        now += 1.0 / calls_per_second
    return now, decisions, switched_at


def noisy(costs: dict[int, dict[Mode, float]], sigma: float,
          seed: int = 5) -> Callable[[int, Mode, float], float]:
    import random

    rng = random.Random(seed)
    return lambda kind, mode, now: costs[kind][mode] * rng.lognormvariate(0.0, sigma)


def test_a_mode_1_5x_faster_is_adopted_within_50_calls_of_a_slow_engine(three_modes):
    """The default parameters, 2.6 calls/s, every call +-15 % noise: sharded at 2/3 of all_gather's cost is
    adopted within 50 calls, from probes that cost the budget nothing (they ran a faster mode)."""
    policy = ModePolicy(PolicyParams(), ModeTable.uniform(A), auto=True, modes=three_modes)
    cost = noisy({GREEDY: {A: 0.030, G: 0.031, S: 0.020}}, 0.15)
    _, decisions, switched_at = simulate_engine(policy, cost, 200, 0.0)
    assert policy.choice[5] == S and switched_at is not None and switched_at <= 50, switched_at
    auto = [d for d in decisions if d.reason == "auto"]
    assert len(auto) == 1 and auto[0].evidence["paired"]["sharded"]["kinds"]["greedy"]["probes"] >= 2
    assert policy.probe_extra_seconds <= policy.params.probe_budget * policy.seconds_total + 0.035  # + one call


def test_a_10_percent_difference_is_adopted_within_500_calls(three_modes):
    policy = ModePolicy(PolicyParams(), ModeTable.uniform(A), auto=True, modes=three_modes)
    cost = noisy({GREEDY: {A: 0.030, G: 0.0303, S: 0.0273}}, 0.1, seed=7)
    _, decisions, switched_at = simulate_engine(policy, cost, 800, 0.0)
    assert policy.choice[5] == S and switched_at is not None and switched_at <= 500, switched_at
    assert len([d for d in decisions if d.reason == "auto"]) == 1


def test_calls_of_different_kinds_are_never_compared():
    """Sampled calls cost 46x a greedy one and both modes cost the same for each kind. A probe that happens to
    see greedy calls against a reference window of sampled ones would find gather 47x faster; pairs per kind
    see equal modes, and the policy never switches."""
    policy = ModePolicy(PolicyParams(), ModeTable.uniform(A), auto=True, modes=TWO)
    cost = noisy({GREEDY: {A: 0.010, G: 0.010}, TOP_P: {A: 0.46, G: 0.46}}, 0.1)
    kinds = (TOP_P,) * 12 + (GREEDY,) * 12  # long runs of one kind: probes land in either
    _, decisions, _ = simulate_engine(policy, cost, 1500, 0.0, kinds=kinds)
    assert not [d for d in decisions if d.reason == "auto"] and policy.choice[5] == A
    ends = [d for d in decisions if d.reason == "probe" and d.evidence["phase"] == "end"]
    ratios = [k["ratio"] for d in ends for k in d.evidence["paired"].get("gather", {}).get("kinds", {}).values()]
    assert ratios and all(0.7 < r < 1.4 for r in ratios), ratios


@pytest.mark.parametrize(("greedy_share", "winner"), [(0.9, S), (0.1, G)])
def test_the_mode_chosen_is_the_one_for_the_traffic_mix(three_modes, greedy_share, winner):
    """Greedy calls: sharded 25 % faster, gather no faster. Top-p calls: gather 25 % faster, and a sharded table
    runs them with all_gather (they step aside). Which mode wins depends on what share of the bucket's time
    each kind takes."""
    costs = {GREEDY: {A: 0.040, G: 0.040, S: 0.030}, TOP_P: {A: 0.040, G: 0.030, S: 0.040}}
    n = round(greedy_share * 10)
    kinds = (GREEDY,) * n + (TOP_P,) * (10 - n)
    policy = ModePolicy(PolicyParams(), ModeTable.uniform(A), auto=True, modes=three_modes)
    _, decisions, _ = simulate_engine(policy, noisy(costs, 0.1), 1200, 0.0, kinds=kinds,
                                      steps_aside=lambda kind, mode: A if mode == S and kind == TOP_P else mode)
    assert policy.choice[5] == winner, [(d.mode, d.evidence.get("paired")) for d in decisions if d.reason == "auto"]


def test_a_slow_modes_probes_cost_at_most_the_budget_in_seconds():
    """gather costs 3x all_gather (a 0.6 s call): its probes end the moment they have spent the budget, so
    what they add stays within probe_budget of all seconds (plus at most one call)."""
    params = PolicyParams(probe_interval_seconds=1.0)
    policy = ModePolicy(params, ModeTable.uniform(A), auto=True, modes=TWO)
    _, decisions, _ = simulate_engine(policy, noisy({GREEDY: {A: 0.2, G: 0.6}}, 0.1), 1500, 0.0)
    assert policy.choice[5] == A and not [d for d in decisions if d.reason == "auto"]
    assert policy.probe_extra_seconds <= params.probe_budget * policy.seconds_total + 0.8
    assert [d for d in decisions if d.reason == "probe"]  # it did probe


def test_noise_around_an_equal_cost_does_not_spend_the_budget():
    """A served CPU engine's steps vary by +-45 % call to call. Probes are charged net of their calls, so the
    calls of an equal mode that ran under the running median pay for the ones over it: the probes run their
    full length instead of ending on the budget after a call or two (charged per call, 4-7 full probes of
    2000 calls got through; confirming a faster mode needs several)."""
    policy = ModePolicy(PolicyParams(), ModeTable.uniform(A), auto=True, modes=TWO)
    _, decisions, _ = simulate_engine(policy, noisy({GREEDY: {A: 0.34, G: 0.34}}, 0.45, seed=1), 2000, 0.0,
                                      calls_per_second=2.5)
    ends = [d for d in decisions if d.reason == "probe" and d.evidence["phase"] == "end"]
    assert len([d for d in ends if d.evidence["probe_calls"] >= policy.params.probe_calls]) >= 15
    assert policy.probe_cost_share <= policy.params.probe_budget + 0.001


def test_kind_evidence_round_trips_through_json(three_modes):
    policy = ModePolicy(PolicyParams(), ModeTable.uniform(A), auto=True, modes=three_modes)
    simulate_engine(policy, noisy({GREEDY: {A: 0.03, G: 0.03, S: 0.02}, TOP_P: {A: 0.3, G: 0.25, S: 0.3}}, 0.1),
                    90, 0.0, kinds=(GREEDY, TOP_P))
    restored = policy_from_json(policy_to_json(policy))
    assert restored.pairs == policy.pairs and {p.kind for v in policy.pairs.values() for p in v} == {GREEDY, TOP_P}
    assert {b: list(m.kinds) for b, m in restored.mix.items()} == {b: list(m.kinds) for b, m in policy.mix.items()}
    assert restored.mix[5].counts == policy.mix[5].counts
    assert restored.kind_estimates.to_json() == policy.kind_estimates.to_json()
    assert (restored.seconds_total, restored.probe_extra_seconds) == (policy.seconds_total, policy.probe_extra_seconds)
    assert (restored.probe is None) == (policy.probe is None)
    if policy.probe is not None:
        assert restored.probe == policy.probe  # its running net extra too
    assert restored.last_probe_end == policy.last_probe_end
    assert restored.evidence(5, 30.0) == policy.evidence(5, 30.0)


def test_a_bucket_follows_its_traffic_when_the_kind_of_calls_changes(three_modes):
    """What a real SGLang bucket saw: greedy traffic first (sharded's path 10x cheaper, gather's 1.5x), then
    top-p traffic (gather 1.7x cheaper; a sharded table runs it with all_gather). The bucket goes to sharded
    while its time is greedy and to gather once it is top-p, each from evidence of that kind."""
    costs = {GREEDY: {A: 0.012, G: 0.008, S: 0.0012}, TOP_P: {A: 0.46, G: 0.27, S: 0.46}}
    def aside(kind, mode):
        return A if mode == S and kind == TOP_P else mode

    policy = ModePolicy(PolicyParams(), ModeTable.uniform(A), auto=True, modes=three_modes)
    now, _, switched_at = simulate_engine(policy, noisy(costs, 0.15), 150, 0.0, steps_aside=aside)
    assert policy.choice[5] == S and switched_at is not None and switched_at <= 50, switched_at
    _, second, switched_at = simulate_engine(policy, noisy(costs, 0.15, seed=9), 300, now, kinds=(TOP_P,),
                                             steps_aside=aside)
    assert policy.choice[5] == G and switched_at is not None and switched_at <= 150, switched_at
    last = [d for d in second if d.reason == "auto"][-1]
    assert last.evidence["mix"]["top_p"] > 0.9 and "top_p" in last.evidence["paired"]["gather"]["kinds"]


def test_a_probe_does_not_wait_on_a_bucket_whose_traffic_stopped():
    """A probe started just before its bucket falls quiet ends within a second or so (4 gaps), not after the
    probe timeout, so the buckets that do have traffic get their probes."""
    policy = ModePolicy(PolicyParams(), ModeTable.uniform(A), auto=True, modes=TWO)
    now = 0.0
    for _ in range(20):  # bucket 1 at 5 calls/s, then silence
        policy.observe(A, 0, 0.01, now, call_tag(GREEDY, int(A)))
        now += 0.2
    policy.step(now)
    assert policy.probe is not None and policy.probe.bucket == 0
    now += 1.5
    policy.observe(A, 5, 0.01, now, call_tag(GREEDY, int(A)))  # bucket 32 has traffic
    out = policy.step(now)
    assert next(d.evidence["phase"] for d in out if d.reason == "probe") == "end"
    assert policy.probe is None or policy.probe.bucket != 0


def test_probes_go_first_to_the_bucket_that_takes_most_of_the_engines_time():
    """One call of 64 rows per 32 calls of 1 row, but each 64-row call costs 100x more: bucket 64 takes three
    quarters of the time, so it is probed before bucket 1, whose every probe would gain little."""
    policy = ModePolicy(FAST, ModeTable.uniform(A), auto=True, modes=TWO)
    rows = (1,) * 32 + (64,)
    costs = {1: 0.001, 64: 0.1}
    now = 0.0
    for i in range(660):  # 0.66 s of calls, no policy step until they are in
        r = rows[i % len(rows)]
        policy.observe(A, bucket_of(r), costs[r], now)
        now += 0.001
    first = next(d for d in policy.step(now) if d.reason == "probe")
    assert first.buckets == ["64"] and first.evidence["phase"] == "start", first


def test_windows_never_adopt_a_mode_whose_probes_found_it_slower(three_modes):
    """A bucket of one kind whose gather window reads 20 % cheaper than all_gather's over the same period (in a
    served engine, the windows weigh a bucket's batch sizes differently), while three probes found gather 5 %
    slower: the pairs decide, and the bucket stays."""
    from gatherwise.sidecar.policy.paired_evidence import Pair

    policy = ModePolicy(PolicyParams(), ModeTable.uniform(A), auto=True, modes=three_modes)
    bucket, now = bucket_of(32), 0.0
    for i in range(2 * policy.params.min_samples):
        mode = A if i % 2 == 0 else G
        policy.observe(mode, bucket, 0.030 if mode == A else 0.024, now, call_tag(GREEDY, int(mode)))
        now += 0.25
    assert policy.auto_choice.challenger(bucket, now) == G  # the windows alone would switch
    policy.pairs[bucket] = deque(Pair(now - 1.0, G, A, 1.05, GREEDY, 0.01, 8) for _ in range(3))
    assert policy.auto_choice.challenger(bucket, now) is None
    assert not [d for d in policy.step(now) if d.reason == "auto"] and policy.choice[bucket] == A
