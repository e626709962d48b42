"""Probes alone (sidecar.policy.probes): which bucket and mode is probed next, what a probe records and charges,
when it ends, and when a bucket has a fresh reference for the next one."""

from __future__ import annotations

import pytest

from gatherwise.call_kind import Sampling, call_kind
from gatherwise.config import PolicyParams
from gatherwise.modes import Mode, ModeTable
from gatherwise.sidecar.policy.auto_choice import AutoChoice
from gatherwise.sidecar.policy.bucket_traffic import BucketTraffic
from gatherwise.sidecar.policy.estimates import Estimate
from gatherwise.sidecar.policy.probes import MIN_PROBE_CALLS, Probe, Probes

A, G = Mode.ALL_GATHER, Mode.GATHER
GREEDY = call_kind(Sampling.GREEDY)
PARAMS = PolicyParams(probe_calls=4, probe_interval_seconds=1.0, probe_budget=0.5, max_sample_age_seconds=100.0,
                      probe_backoff_margin=0.25)


def parts(params: PolicyParams = PARAMS) -> tuple[Probes, AutoChoice, BucketTraffic]:
    traffic = BucketTraffic(params, (A, G))
    return Probes(params, (A, G), traffic), AutoChoice(params, (A, G), ModeTable.uniform(A), traffic), traffic


def running_calls(probes: Probes, traffic: BucketTraffic, bucket: int, seconds: float, times: list[float]) -> None:
    for t in times:
        traffic.add(bucket, A, A, GREEDY, seconds, t)
        probes.observe(bucket, A, GREEDY, seconds, t, running=A, pinned=False)


def test_a_probe_is_settled_once_every_kind_it_saw_is_decisive():
    probe = Probe(0, G, 0.0, samples={GREEDY: [0.005] * 4}, references={GREEDY: [0.010] * 4})
    assert probe.settled()
    probe.samples[2] = [0.010, 0.011, 0.009]
    probe.references[2] = [0.010, 0.010, 0.011]
    assert not probe.settled()  # a kind that measured the same as its reference could still go either way
    assert not Probe(0, G, 0.0, samples={GREEDY: [0.005]}).settled()  # nothing to compare with


def test_the_bucket_that_takes_most_of_the_engine_s_time_is_probed_first():
    probes, choice, traffic = parts()
    running_calls(probes, traffic, 0, 0.001, [i * 0.01 for i in range(10)])
    running_calls(probes, traffic, 5, 0.050, [i * 0.01 for i in range(10)])
    probe = probes.start_next([0, 5], choice, now=0.1)
    assert probe is not None and (probe.bucket, probe.mode, probe.started) == (5, G, 0.1)
    assert probes.probe is probe and probes.last_probe == {(5, G): 0.1}


def test_no_probe_without_budget_traffic_or_an_unpinned_bucket():
    probes, choice, traffic = parts(PolicyParams(probe_budget=0.0))
    running_calls(probes, traffic, 0, 0.001, [0.0, 0.01])
    assert probes.start_next([0], choice, now=0.02) is None  # probe_budget 0: never
    probes, choice, traffic = parts()
    assert probes.start_next(range(16), choice, now=0.0) is None  # no traffic anywhere
    running_calls(probes, traffic, 0, 0.001, [0.0, 0.01])
    assert probes.start_next([1, 2], choice, now=0.02) is None  # bucket 0 pinned: not offered
    assert probes.start_next([0], choice, now=5.0) is None  # bucket 0 went quiet


def test_a_mode_is_probed_again_only_after_its_interval():
    probes, choice, traffic = parts()
    running_calls(probes, traffic, 0, 0.001, [i * 0.01 for i in range(10)])
    assert probes.start_next([0], choice, now=0.1) is not None
    probes.finish(now=0.15)
    running_calls(probes, traffic, 0, 0.001, [0.2 + i * 0.01 for i in range(90)])
    assert probes.start_next([0], choice, now=1.05) is None  # 0.95 s after the last probe of gather
    assert probes.start_next([0], choice, now=1.11) is not None
    assert probes.interval(0, G) == PARAMS.probe_interval_seconds


def test_a_probe_records_its_calls_against_the_running_mode_just_before_and_ends_after_probe_calls():
    probes, choice, traffic = parts()
    running_calls(probes, traffic, 0, 0.010, [i * 0.01 for i in range(10)])
    probe = probes.start_next([0], choice, now=0.1)
    assert probe is not None
    ended = []
    costs = [0.011, 0.013, 0.009, 0.015]  # 0.002 s slower on average, too noisy to settle early
    for i, seconds in enumerate(costs):
        t = 0.1 + i * 0.01
        traffic.add(0, G, G, GREEDY, seconds, t)
        ended.append(probes.observe(0, G, GREEDY, seconds, t, running=A, pinned=False))
    assert ended == [False] * (PARAMS.probe_calls - 1) + [True]
    assert probe.samples == {GREEDY: costs}
    assert probe.references == {GREEDY: [0.010] * 2 * PARAMS.probe_calls}  # the newest before it started
    assert probe.extra == pytest.approx(PARAMS.probe_calls * 0.002)
    assert probes.budget.probe_calls_used == PARAMS.probe_calls and probes.budget.probe_extra_seconds == 0.0
    assert probes.due_to_end(now=0.15)
    assert probes.finish(now=0.15) is probe and probes.probe is None
    assert probes.budget.probe_extra_seconds == pytest.approx(PARAMS.probe_calls * 0.002)  # charged at its end
    assert probes.last_probe_end == {0: 0.15}


def test_a_call_of_another_mode_outside_the_probe_is_charged_at_once_and_a_pinned_one_never():
    probes, _, traffic = parts()
    running_calls(probes, traffic, 0, 0.010, [0.0, 0.01, 0.02])
    traffic.add(0, G, G, GREEDY, 0.013, 0.03)
    probes.observe(0, G, GREEDY, 0.013, 0.03, running=A, pinned=False)  # a table that had not caught up yet
    assert probes.budget.probe_extra_seconds == pytest.approx(0.003)
    traffic.add(1, G, G, GREEDY, 0.5, 0.04)
    assert not probes.observe(1, G, GREEDY, 0.5, 0.04, running=A, pinned=True)
    assert probes.budget.probe_calls_used == 1 and probes.budget.calls_total == 5


def test_a_cancelled_probe_is_charged_but_leaves_no_end_time():
    probes, choice, traffic = parts()
    running_calls(probes, traffic, 0, 0.010, [i * 0.01 for i in range(10)])
    probe = probes.start_next([0], choice, now=0.1)
    assert probe is not None
    probe.extra = 0.2
    probes.cancel()
    assert probes.probe is None and probes.budget.probe_extra_seconds == 0.2 and probes.last_probe_end == {}
    probes.cancel()  # nothing running: nothing happens
    assert probes.budget.probe_extra_seconds == 0.2


def test_a_probe_that_outlives_its_bucket_s_traffic_is_due_to_end():
    probes, choice, traffic = parts()
    running_calls(probes, traffic, 0, 0.010, [i * 0.01 for i in range(10)])
    assert probes.start_next([0], choice, now=0.1) is not None
    assert not probes.due_to_end(now=0.2)
    assert probes.due_to_end(now=1.5)  # quiet: no call for over a second


def test_the_next_probe_waits_for_fresh_calls_of_the_running_mode():
    probes, choice, traffic = parts()
    assert probes.fresh_reference(0)  # never probed
    running_calls(probes, traffic, 0, 0.010, [i * 0.01 for i in range(10)])
    assert probes.start_next([0], choice, now=0.1) is not None
    probes.finish(now=0.12)
    running_calls(probes, traffic, 0, 0.010, [0.13 + i * 0.01 for i in range(MIN_PROBE_CALLS - 1)])
    assert not probes.fresh_reference(0)
    running_calls(probes, traffic, 0, 0.010, [0.2])
    assert probes.fresh_reference(0)


def test_a_moved_load_makes_the_bucket_s_modes_due_again():
    probes, _, _ = parts()
    probes.last_probe[(0, G)] = 5.0
    probes.last_probe[(1, G)] = 5.0
    probe = Probe(0, G, 5.0)
    assert probes.after_probe(probe, 2.0, Estimate(10, 0.01, 0.01, 0.01, 0.0), False) == 2.0
    probes.watch_load(0, Estimate(10, 0.011, 0.011, 0.011, 0.0))  # within the back-off margin
    assert (0, G) in probes.last_probe and probes.interval(0, G) == 2.0 * PARAMS.probe_interval_seconds
    probes.watch_load(0, Estimate(10, 0.02, 0.02, 0.02, 0.0))
    assert probes.last_probe == {(1, G): 5.0} and probes.interval(0, G) == PARAMS.probe_interval_seconds
