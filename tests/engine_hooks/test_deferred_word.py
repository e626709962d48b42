"""DeferredWords: the word stashed during call k is adopted at call k + lag, never earlier, never twice, and an
adoption whose copy has not landed waits for it (counted) instead of reading a stale slot."""

import pytest
import torch

from gatherwise.engine_hooks.deferred_word import ADOPT_LAG, DeferredWords


class StandInEvent:
    """Stands in for torch.cuda.Event (no GPU here): query() answers what the test says the device has done."""

    def __init__(self) -> None:
        self.done = True
        self.recorded = self.synchronized = 0

    def record(self) -> None:
        self.recorded += 1

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.synchronized += 1
        self.done = True


def test_words_are_adopted_exactly_lag_calls_after_they_arrive():
    words = DeferredWords("cpu")
    assert words.lag == ADOPT_LAG
    taken = []
    for call in range(8):
        taken.append(words.take(call))
        words.stash(call, torch.tensor([100 + call]))
    assert taken == [None] * ADOPT_LAG + [100 + c for c in range(8 - ADOPT_LAG)]


def test_a_skipped_stash_leaves_no_stale_word():
    words = DeferredWords("cpu", lag=2)
    words.stash(0, torch.tensor([7]))
    assert words.take(2) == 7
    # call 1 never stashed (e.g. a call that failed before its collective): call 3 adopts nothing
    assert words.take(3) is None
    assert words.take(2) == 7  # a slot is only valid for the call index it was stashed for


def test_an_incomplete_copy_is_waited_for_and_counted():
    events: list[StandInEvent] = []

    def factory():
        events.append(StandInEvent())
        return events[-1]

    words = DeferredWords("cpu", lag=2, event_factory=factory)
    words.stash(0, torch.tensor([-5]))
    assert events[0].recorded == 1
    events[0].done = False  # the device has not reached call 0's copy yet
    assert words.take(2) == -5
    assert (words.waits, events[0].synchronized) == (1, 1)
    words.stash(1, torch.tensor([6]))
    assert words.take(3) == 6 and words.waits == 1  # completed copies cost no wait


def test_lag_must_be_positive():
    with pytest.raises(ValueError, match="lag"):
        DeferredWords("cpu", lag=0)
