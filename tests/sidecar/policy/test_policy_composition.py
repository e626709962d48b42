"""ModePolicy as the composition of its parts: one set of parameters for all of them, pins over the choice and
probes, and the views the control API and the saved state read are the parts' own state."""

from __future__ import annotations

from gatherwise.config import PolicyParams
from gatherwise.modes import Mode, ModeTable, bucket_of
from gatherwise.sidecar.policy.mode_policy import ModePolicy

A, G = Mode.ALL_GATHER, Mode.GATHER
PARAMS = PolicyParams(window=16, probe_calls=4, probe_interval_seconds=0.1, probe_budget=0.5,
                      max_sample_age_seconds=100.0)


def busy(policy: ModePolicy, rows: int, calls: int, now: float) -> float:
    for _ in range(calls):
        policy.observe(policy.desired_table().mode_for_rows(rows), bucket_of(rows), 0.01, now)
        now += 0.01
    return now


def test_new_parameters_reach_every_part():
    policy = ModePolicy(PARAMS, ModeTable.uniform(A), auto=True, modes=(A, G))
    params = PolicyParams.model_validate({**PARAMS.model_dump(), "window": 8, "margin": 0.2, "probe_calls": 2})
    policy.set_params(params)
    assert policy.params is params and policy.auto_choice.params is params and policy.probes.params is params
    assert policy.traffic.window == 8 and policy.traffic.estimates.window == 8


def test_a_pin_ends_the_probe_of_its_bucket_and_hides_it_from_the_auto_choice():
    policy = ModePolicy(PARAMS, ModeTable.uniform(A), auto=True, modes=(A, G))
    now = busy(policy, 1, 20, 0.0)
    started = [d for d in policy.step(now) if d.reason == "probe"]
    assert started and policy.probe is not None and policy.desired_table().modes[0] == G
    decision = policy.pin(A, [0], now)
    assert decision.previous == {"1": "gather"}  # what the engine ran there: the probe
    assert policy.probe is None and policy.pins == {0: A} and policy.policy_label == "mixed"
    assert policy.learned_table() == policy.desired_table() == ModeTable.uniform(A)


def test_the_views_are_the_parts_state():
    policy = ModePolicy(PARAMS, ModeTable.uniform(A), auto=True, modes=(A, G))
    busy(policy, 1, 5, 0.0)
    assert policy.choice is policy.auto_choice.choice and policy.pairs is policy.auto_choice.pairs
    assert policy.estimates is policy.traffic.estimates and policy.mix is policy.traffic.mix
    assert policy.backoff is policy.probes.backoff.factors and policy.decisions is policy.log.decisions
    assert (policy.calls_total, policy.probe_calls_used) == (5, 0) and policy.pins is policy.pinned.modes
