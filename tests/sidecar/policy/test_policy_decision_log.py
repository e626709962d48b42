"""The decision log alone (sidecar.policy.decision_log): ids, the wall-clock stamp, labels, the bound."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gatherwise.modes import Mode, bucket_label
from gatherwise.sidecar.policy.decision_log import DECISION_LOG, Decision, DecisionLog

A, G = Mode.ALL_GATHER, Mode.GATHER


def test_a_decision_is_stamped_with_the_wall_clock_and_names_buckets_by_label():
    log = DecisionLog(wall_clock=lambda: 1234.5)
    d = log.record("auto", G.label, [3], {3: A}, {"margin": 0.05})
    assert (d.id, d.time, d.reason, d.mode) == (1, 1234.5, "auto", "gather")
    assert d.buckets == [bucket_label(3)] and d.previous == {bucket_label(3): "all_gather"}
    assert d.evidence == {"margin": 0.05} and d.command_seq is None
    assert list(log.decisions) == [d] and log.next_id == 2


def test_the_log_keeps_the_newest_decisions_and_ids_never_repeat():
    log = DecisionLog(wall_clock=lambda: 0.0)
    for _ in range(DECISION_LOG + 10):
        log.record("probe", A.label, [0], {0: G}, {})
    ids = [d.id for d in log.decisions]
    assert len(ids) == DECISION_LOG and ids[0] == 11 and ids[-1] == DECISION_LOG + 10
    assert log.next_id == DECISION_LOG + 11


def test_a_decision_is_validated_when_made():
    log = DecisionLog(wall_clock=lambda: 0.0)
    assert log.record("manual", "auto", [0, 1], {0: G}, {}).mode == "auto"  # releasing pins: "auto"
    with pytest.raises(ValidationError):
        log.record("manual", "no_such_mode", [0], {}, {})
    with pytest.raises(ValidationError):
        Decision(1, 0.0, "guess", "gather", [], {})  # type: ignore[arg-type]  # not a reason
