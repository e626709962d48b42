"""Probe back-off alone (sidecar.policy.probe_backoff): doubling up to the maximum (far behind, or settled slower
by the paired evidence), reset when close, reset when the load moves."""

from __future__ import annotations

from gatherwise.config import PolicyParams
from gatherwise.modes import Mode
from gatherwise.sidecar.policy.estimates import Estimate
from gatherwise.sidecar.policy.probe_backoff import ProbeBackoff

A, G, S = Mode.ALL_GATHER, Mode.GATHER, Mode.SHARDED
PARAMS = PolicyParams(probe_backoff_margin=0.25, probe_backoff_max=8.0)


def est(value: float) -> Estimate:
    return Estimate(50, value, value, value, 0.0)


def test_a_mode_found_far_behind_waits_twice_as_long_each_time_up_to_the_maximum():
    backoff = ProbeBackoff()
    factors = [backoff.after_probe(0, G, 2.0, est(0.01), PARAMS) for _ in range(5)]
    assert factors == [2.0, 4.0, 8.0, 8.0, 8.0] and backoff.factor(0, G) == 8.0
    assert backoff.factor(0, S) == 1.0 and backoff.factor(1, G) == 1.0
    assert backoff.reference == {0: 0.01}  # the chosen mode's cost when the bucket began backing off


def test_a_mode_found_close_or_not_measured_is_probed_at_the_base_interval_again():
    backoff = ProbeBackoff()
    backoff.after_probe(0, G, 2.0, est(0.01), PARAMS)
    backoff.after_probe(0, S, 2.0, est(0.01), PARAMS)
    assert backoff.after_probe(0, G, 1.1, est(0.01), PARAMS) == 1.0
    assert backoff.factor(0, G) == 1.0 and backoff.reference == {0: 0.01}  # sharded still backs off
    assert backoff.after_probe(0, S, None, est(0.01), PARAMS) == 1.0  # a probe that paired nothing
    assert backoff.factors == {} and backoff.reference == {}
    assert backoff.after_probe(0, G, 2.0, None, PARAMS) == 1.0  # nothing to compare the load with later


def test_a_mode_the_evidence_settles_as_slower_backs_off_though_the_probe_found_it_close():
    backoff = ProbeBackoff()
    assert backoff.after_probe(0, G, 1.08, est(0.01), PARAMS, settled_slower=True) == 2.0
    assert backoff.after_probe(0, G, 1.03, est(0.01), PARAMS, settled_slower=True) == 4.0
    assert backoff.after_probe(0, G, 1.08, est(0.01), PARAMS) == 1.0  # close, and nothing settled: reset
    assert backoff.after_probe(0, G, None, est(0.01), PARAMS, settled_slower=True) == 1.0  # paired nothing


def test_a_moved_load_resets_the_bucket():
    backoff = ProbeBackoff()
    backoff.after_probe(0, G, 2.0, est(0.010), PARAMS)
    backoff.after_probe(1, G, 2.0, est(0.010), PARAMS)
    assert not backoff.load_moved(0, est(0.012), PARAMS)  # within 25 %
    assert not backoff.load_moved(0, None, PARAMS) and not backoff.load_moved(2, est(1.0), PARAMS)
    assert backoff.load_moved(0, est(0.013), PARAMS)
    assert backoff.factor(0, G) == 1.0 and 0 not in backoff.reference
    assert backoff.factor(1, G) == 2.0  # other buckets keep theirs
    backoff.reset(1)
    assert backoff.factors == {} and backoff.reference == {}
