"""What each bucket's calls measured, alone (sidecar.policy.bucket_traffic): windows by the mode that ran and by
kind and the mode the table named, the kinds' shares of the bucket's time, quiet buckets, time shares."""

from __future__ import annotations

import math

import pytest

from gatherwise.call_kind import Sampling, call_kind
from gatherwise.config import PolicyParams
from gatherwise.modes import Mode
from gatherwise.sidecar.policy.bucket_traffic import QUIET_SECONDS, BucketTraffic, cell

A, G, S = Mode.ALL_GATHER, Mode.GATHER, Mode.SHARDED
GREEDY, TOP_P = call_kind(Sampling.GREEDY), call_kind(Sampling.TOP_P)
PARAMS = PolicyParams(window=16, max_sample_age_seconds=100.0)


def traffic() -> BucketTraffic:
    return BucketTraffic(PARAMS, (A, G, S))


def test_a_call_counts_for_the_mode_that_ran_and_for_its_kind_under_the_mode_its_table_named():
    t = traffic()
    t.add(2, A, S, TOP_P, 0.5, now=1.0)  # a sharded table's top-p call that stepped aside to all_gather
    ran, named = t.estimates.get(2, A, 1.0), t.kind_estimates.get(cell(2, TOP_P), S, 1.0)
    assert ran is not None and ran.value == 0.5 and named is not None and named.value == 0.5
    assert t.estimates.get(2, S, 1.0) is None and t.kind_estimates.get(cell(2, TOP_P), A, 1.0) is None
    assert t.mix[2].counts == {TOP_P: 1} and list(t.arrivals[2]) == [1.0]


def test_kinds_share_the_bucket_by_calls_times_their_cost_under_the_running_mode():
    t = traffic()
    for i in range(4):
        t.add(0, A, A, GREEDY, 0.01, now=float(i))
        t.add(0, A, A, TOP_P, 0.03, now=float(i))
    shares = t.shares(0, A, now=4.0)
    assert shares.keys() == {GREEDY, TOP_P}
    assert math.isclose(shares[GREEDY], 0.25) and math.isclose(shares[TOP_P], 0.75)
    assert t.shares(1, A, now=4.0) == {}  # a bucket without calls


def test_a_kind_the_running_mode_has_not_run_weighs_what_another_mode_measured_for_it():
    t = traffic()
    t.add(0, A, A, GREEDY, 0.01, now=0.0)
    for i in range(3):
        t.add(0, G, G, TOP_P, 0.2, now=float(i))
    t.add(0, S, S, TOP_P, 0.9, now=0.0)  # fewer samples than gather's: not the one used
    assert t.kind_cost(0, TOP_P, A, now=3.0) == pytest.approx(0.2)
    assert t.kind_cost(0, GREEDY, A, now=3.0) == pytest.approx(0.01)


def test_probe_calls_are_charged_against_the_running_mode_of_their_kind_else_of_the_bucket():
    t = traffic()
    t.add(0, A, A, GREEDY, 0.01, now=0.0)
    assert t.running_cost(0, GREEDY, A, fallback=9.0, now=0.0) == pytest.approx(0.01)
    assert t.running_cost(0, TOP_P, A, fallback=9.0, now=0.0) == pytest.approx(0.01)  # the bucket's median
    assert t.running_cost(1, GREEDY, A, fallback=9.0, now=0.0) == 9.0  # nothing measured: the call itself


def test_the_load_is_watched_on_the_bucket_s_most_frequent_kind():
    t = traffic()
    for i in range(3):
        t.add(0, A, A, GREEDY, 0.01, now=float(i))
    t.add(0, A, A, TOP_P, 0.5, now=3.0)
    running = t.running_estimate(0, A, now=3.0)
    assert running is not None and running.value == pytest.approx(0.01)


def test_a_bucket_is_quiet_without_calls_for_four_gaps_and_at_least_a_second():
    t = traffic()
    assert t.quiet(0, now=0.0)  # never a call
    for i in range(4):
        t.add(0, A, A, GREEDY, 0.01, now=i * 0.01)
    assert t.mean_gap(0) == pytest.approx(0.01)
    assert not t.quiet(0, now=0.03 + QUIET_SECONDS * 0.9)
    assert t.quiet(0, now=0.03 + QUIET_SECONDS * 1.1)
    for i in range(4):
        t.add(1, A, A, GREEDY, 0.01, now=i * 2.0)  # a gap of 2 s: quiet after 8 s
    assert not t.quiet(1, now=6.0 + 7.0) and t.quiet(1, now=6.0 + 8.5)


def test_time_shares_are_rounded_so_that_buckets_of_about_the_same_weight_tie():
    t = traffic()
    for i in range(4):
        t.add(0, A, A, GREEDY, 0.100, now=i * 0.1)  # busy all the time: 1 s per s
        t.add(1, A, A, GREEDY, 0.105, now=i * 0.1)  # 5 % more: the same step of the 1.5^k scale
        t.add(2, A, A, GREEDY, 0.500, now=i * 0.1)
    near, same, busy = (t.time_share(b, A, now=0.3) for b in (0, 1, 2))
    assert near == same == 1.0 and busy == 1.5 ** 4
    assert t.time_share(3, A, now=0.3) == 0.0  # no calls


def test_new_parameters_keep_the_newest_samples_and_kinds():
    t = traffic()
    for i in range(16):
        t.add(0, A, A, GREEDY if i < 12 else TOP_P, float(i + 1), now=float(i))
    t.resize(PolicyParams(window=8, max_sample_age_seconds=100.0))
    est = t.estimates.get(0, A, now=16.0)
    assert est is not None and est.samples == 8 and est.p50 == pytest.approx(12.5)
    assert t.mix[0].counts == {GREEDY: 4, TOP_P: 4}
    t.add(5, A, A, GREEDY, 0.1, now=20.0)
    assert t.mix[5].kinds.maxlen == 8  # a new bucket's mix is as long as the new window
