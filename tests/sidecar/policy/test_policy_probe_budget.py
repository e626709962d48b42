"""The probe budget alone (sidecar.policy.probe_budget): net charging, the running probe's share, the shares."""

from __future__ import annotations

import pytest

from gatherwise.sidecar.policy.probe_budget import ProbeBudget


def test_a_probe_is_charged_net_and_a_saving_earns_nothing():
    budget = ProbeBudget()
    budget.charge(-0.5)  # a probe of a faster mode: free, and no credit for the next one
    assert budget.probe_extra_seconds == 0.0
    budget.charge(0.25)
    assert budget.probe_extra_seconds == 0.25


def test_the_running_probe_counts_once_it_costs_more():
    budget = ProbeBudget()
    for _ in range(10):
        budget.count_call(1.0)
    budget.charge(0.1)
    assert budget.charged(None) == pytest.approx(0.1)
    assert budget.charged(-0.3) == pytest.approx(0.1)  # running ahead of the running mode: not counted yet
    assert budget.charged(0.2) == pytest.approx(0.3)
    assert not budget.over(0.05, None) and budget.over(0.005, None)  # 0.1 s of 10 s: 1 %
    assert not budget.over(0.05, 0.3) and budget.over(0.05, 0.5)  # the running probe tips it over 5 %
    assert budget.cost_share(0.5) == pytest.approx(0.06)


def test_shares_of_calls_and_seconds_start_at_zero():
    budget = ProbeBudget()
    assert budget.call_share == 0.0 and budget.cost_share(None) == 0.0 and not budget.over(0.0, None)
    budget.count_call(2.0)
    budget.count_call(2.0)
    budget.count_probe_call()
    assert budget.call_share == 0.5 and (budget.calls_total, budget.seconds_total) == (2, 4.0)
