"""The auto choice alone (sidecar.policy.auto_choice), fed pairs and windows directly: when paired evidence makes
a bucket switch, when windows may, what overrules them, the dwell, and what a finished probe records."""

from __future__ import annotations

import math
from collections import deque

import pytest

from gatherwise.call_kind import Sampling, call_kind
from gatherwise.config import PolicyParams
from gatherwise.modes import Mode, ModeTable
from gatherwise.sidecar.policy.auto_choice import MIN_PROBES, AutoChoice
from gatherwise.sidecar.policy.bucket_traffic import BucketTraffic
from gatherwise.sidecar.policy.paired_evidence import Pair

A, G, S = Mode.ALL_GATHER, Mode.GATHER, Mode.SHARDED
GREEDY, TOP_P = call_kind(Sampling.GREEDY), call_kind(Sampling.TOP_P)
PARAMS = PolicyParams(margin=0.05, min_samples=10, window=64, dwell_seconds=5.0, probe_calls=8,
                      max_sample_age_seconds=100.0)


def choice_of(modes: tuple[Mode, ...] = (A, G, S)) -> AutoChoice:
    traffic = BucketTraffic(PARAMS, modes)
    return AutoChoice(PARAMS, modes, ModeTable.uniform(A), traffic)


def greedy_calls(choice: AutoChoice, bucket: int, n: int = 8) -> None:
    """Calls of one kind under the running mode, so the bucket's mix is all greedy."""
    for i in range(n):
        choice.traffic.add(bucket, A, A, GREEDY, 0.01, now=float(i))


def pairs(choice: AutoChoice, bucket: int, probed: Mode, reference: Mode, ratio: float, n: int,
          log_se: float = 0.02, now: float = 10.0) -> None:
    found = choice.pairs.setdefault(bucket, deque())
    found.extend(Pair(now, probed, reference, ratio, GREEDY, log_se, 8) for _ in range(n))


def test_a_bucket_switches_on_decisive_pairs_from_enough_probes_to_the_fastest_mode():
    choice = choice_of()
    greedy_calls(choice, 0)
    pairs(choice, 0, G, A, 0.8, MIN_PROBES - 1)
    assert choice.challenger(0, now=10.0) is None  # one probe can coincide with a load step
    pairs(choice, 0, G, A, 0.8, 1)
    pairs(choice, 0, S, A, 0.6, MIN_PROBES)
    assert choice.challenger(0, now=10.0) == S


def test_pairs_inside_the_margin_or_not_decisive_do_not_switch():
    choice = choice_of()
    greedy_calls(choice, 0)
    pairs(choice, 0, G, A, 0.97, 6)  # decisive, but within the 5 % margin
    pairs(choice, 0, S, A, 0.8, 2, log_se=0.5)  # 20 % faster, but far from Z standard errors
    assert choice.challenger(0, now=10.0) is None
    assert choice.promising(0, S, now=10.0) == pytest.approx(0.8)  # so it is probed again soon
    assert choice.promising(0, G, now=10.0) is None


def test_probes_of_the_running_mode_taken_while_another_ran_count_inverted():
    choice = choice_of((A, G))
    greedy_calls(choice, 0)
    pairs(choice, 0, A, G, 1.25, 2)  # all_gather probed under gather: 25 % slower
    found = choice.paired_evidence(0, G, now=10.0)
    assert found is not None and found.probes == 2 and found.ratio == pytest.approx(0.8)
    assert choice.challenger(0, now=10.0) == G


def test_pairs_older_than_the_sample_age_are_dropped():
    choice = choice_of()
    greedy_calls(choice, 0)
    pairs(choice, 0, G, A, 0.5, 3, now=0.0)
    assert choice.paired_evidence(0, G, now=50.0) is not None
    assert choice.paired_evidence(0, G, now=100.5) is None and not choice.pairs[0]


def test_windows_decide_a_bucket_of_one_kind_measured_over_the_same_period():
    choice = choice_of((A, G))

    def alternate(first: int, last: int) -> None:  # all_gather first: gather is measured within its window
        for i in range(first, last):
            mode = A if i % 2 == 0 else G
            choice.traffic.add(0, mode, mode, GREEDY, 0.010 if mode == A else 0.008, now=1.0 + i)

    assert choice.challenger(0, now=0.0) is None
    alternate(0, 12)
    assert choice.challenger(0, now=13.0) is None  # 6 samples each: below min_samples
    alternate(12, 24)
    assert choice.challenger(0, now=25.0) == G
    pairs(choice, 0, G, A, 1.0, 1)  # one probe found it no faster: pairs overrule windows
    assert choice.challenger(0, now=25.0) is None


def test_windows_of_another_mode_older_than_the_running_mode_s_do_not_count():
    choice = choice_of((A, G))
    for i in range(24):
        mode = G if i % 2 == 0 else A  # gather's samples begin before all_gather's window
        choice.traffic.add(0, mode, mode, GREEDY, 0.010 if mode == A else 0.008, now=1.0 + i)
    assert choice.challenger(0, now=25.0) is None


def test_windows_never_decide_a_bucket_of_several_kinds():
    choice = choice_of((A, G))
    for i in range(40):
        kind = GREEDY if i % 4 else TOP_P
        mode = A if i % 2 else G
        choice.traffic.add(0, mode, mode, kind, 0.010 if mode == A else 0.005, now=float(i))
    assert choice.challenger(0, now=40.0) is None


def test_a_switch_starts_the_dwell():
    choice = choice_of()
    assert not choice.dwelling(3, now=0.0)
    choice.switch(3, G, now=1.0)
    assert choice.choice[3] == G and choice.others(3) == [A, S]
    assert choice.dwelling(3, now=5.9) and not choice.dwelling(3, now=6.0)


def test_a_finished_probe_records_one_pair_per_kind_against_the_running_mode():
    choice = choice_of()
    greedy_calls(choice, 0)
    samples = {GREEDY: [0.008] * 4, TOP_P: [0.3] * 4}
    references = {GREEDY: [0.010] * 4}  # no top-p reference: no pair for that kind
    ratio = choice.record_probe(0, G, samples, references, now=9.0)
    (pair,) = choice.pairs[0]
    assert (pair.probed, pair.reference, pair.kind, pair.calls) == (G, A, GREEDY, 4)
    assert pair.ratio == pytest.approx(0.8) and ratio == pytest.approx(0.8)
    assert choice.record_probe(0, G, {}, {}, now=9.0) is None


def test_the_logged_evidence_names_margin_mix_estimates_and_pairs():
    choice = choice_of((A, G))
    greedy_calls(choice, 0)
    pairs(choice, 0, G, A, 0.8, 2)
    evidence = choice.evidence(0, now=8.0)
    assert evidence["bucket"] == "1" and evidence["margin"] == 0.05 and evidence["probes_needed"] == MIN_PROBES
    assert evidence["mix"] == {"greedy": 1.0} and evidence["estimates"]["gather"] is None
    assert evidence["estimates"]["all_gather"]["samples"] == 8
    assert math.isclose(evidence["paired"]["gather"]["ratio"], 0.8)
    assert choice.pairs_needed == math.ceil(PARAMS.min_samples / PARAMS.probe_calls)
