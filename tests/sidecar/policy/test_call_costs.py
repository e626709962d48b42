"""What a joined call costs its mode (sidecar.call_costs): its step, known at the next call, or its path."""

from __future__ import annotations

from typing import Any, cast

from pytest import approx

from gatherwise.sidecar.ingest.joined_call import JoinedCall
from gatherwise.sidecar.policy.call_costs import MIN_RESTS, REST_CAP, CallCosts

ENGINE, OTHER = cast(Any, object()), cast(Any, object())


def call(index: int, start_ms: float, path_ms: float = 1.0, engine: Any = ENGINE, mode: int = 0) -> JoinedCall:
    return JoinedCall(engine, index, mode, 3, path_ms * 1e-3, 0, int(start_ms * 1e6))


def warmed(steps: int = MIN_RESTS) -> tuple[CallCosts, int, float]:
    """CallCosts past its first `steps` steps of 1 ms path + 99 ms rest (the cap exists from then on): (costs,
    the next call index, the next start in ms)."""
    costs = CallCosts()
    for i in range(steps + 1):  # a step ends where the next call starts
        costs.charge(call(i, 100.0 * i), "step")
    return costs, steps + 1, 100.0 * (steps + 1)


def test_a_step_is_charged_to_the_call_it_follows_once_the_next_call_starts():
    costs, i, t = warmed()
    first, second, third = call(i, t, mode=1), call(i + 1, t + 40.0, mode=2), call(i + 2, t + 55.0)
    learned, seconds = costs.charge(first, "step") or (None, None)
    assert learned is not first  # its step ends when the next call starts
    learned, seconds = costs.charge(second, "step") or (None, None)
    assert learned is first and seconds == approx(0.04)
    learned, seconds = costs.charge(third, "step") or (None, None)
    assert learned is second and seconds == approx(0.015)


def test_the_first_steps_teach_nothing_until_a_median_caps_their_idle_part():
    costs = CallCosts()
    costs.charge(call(0, 0.0), "step")
    # the warm-up request, then 8 s until the first traffic: no median yet to cap those 8 s against
    assert costs.charge(call(1, 8000.0), "step") is None
    for i in range(2, MIN_RESTS + 1):
        assert costs.charge(call(i, 8000.0 + 100.0 * (i - 1)), "step") is None
    assert costs.charge(call(MIN_RESTS + 1, 8000.0 + 100.0 * MIN_RESTS), "step") is not None


def test_no_step_across_a_missing_call_or_another_engine():
    costs, i, t = warmed()
    costs.charge(call(i, t), "step")
    assert costs.charge(call(i + 2, t + 50.0), "step") is None  # call i+1 was never joined: 50 ms is two steps
    assert costs.charge(call(0, t + 60.0, engine=OTHER), "step") is None  # a new engine starts its own sequence
    assert costs.charge(call(1, t + 70.0, engine=OTHER), "step") is not None


def test_a_step_is_never_shorter_than_its_path():
    costs, i, t = warmed()
    costs.charge(call(i, t, path_ms=9.0), "step")  # clocks of two ranks can make the next start look early
    _, seconds = costs.charge(call(i + 1, t + 5.0), "step") or (None, None)
    assert seconds == approx(0.009)


def test_path_cost_is_the_call_itself_and_a_switch_to_step_loses_no_call():
    costs, i, t = warmed()
    only = call(i, t, path_ms=2.0)
    assert costs.charge(only, "path") == (only, approx(0.002))
    learned, seconds = costs.charge(call(i + 1, t + 30.0), "step") or (None, None)
    assert learned is only and seconds == approx(0.03)


def test_an_idle_gap_counts_at_most_rest_cap_times_the_recent_median_rest():
    costs = CallCosts()
    start = 0.0
    for i in range(MIN_RESTS + 1):  # steps of 1 ms path + 9 ms rest
        costs.charge(call(i, start), "step")
        start += 10.0
    idle = call(MIN_RESTS + 1, start + 5000.0)  # the engine waited 5 s for a request
    costs.charge(idle, "step")
    _, seconds = costs.charge(call(MIN_RESTS + 2, start + 5010.0), "step") or (None, None)
    assert seconds == approx(0.010)  # the step after the gap is an ordinary one
    costs2 = CallCosts()
    start = 0.0
    for i in range(MIN_RESTS + 1):
        costs2.charge(call(i, start), "step")
        start += 10.0
    _, seconds = costs2.charge(call(MIN_RESTS + 1, start + 5000.0), "step") or (None, None)
    assert seconds == approx(0.001 + REST_CAP * 0.009)  # the call before the gap: capped, still 4x slower


def test_a_longer_rest_that_lasts_raises_the_cap_within_half_a_window():
    costs = CallCosts()
    start, i = 0.0, 0
    for _ in range(MIN_RESTS + 8):  # 9 ms rests
        costs.charge(call(i, start), "step")
        start, i = start + 10.0, i + 1
    seen = []
    for _ in range(48):  # a mode whose rest is 10x longer: 90 ms
        found = costs.charge(call(i, start), "step")
        seen.append(found[1] if found else None)
        start, i = start + 91.0, i + 1
    assert seen[1] == approx(0.001 + REST_CAP * 0.009)  # capped at first
    assert seen[-1] == approx(0.091)  # the window has learned the new rest
