"""Operator pins alone (sidecar.policy.pins): what a pin overrides, what the policy is called, what release returns."""

from __future__ import annotations

from gatherwise.modes import NUM_BUCKETS, Mode, ModeTable
from gatherwise.sidecar.policy.pins import Pins, chosen_buckets

A, G, S = Mode.ALL_GATHER, Mode.GATHER, Mode.SHARDED


def test_a_request_names_every_bucket_or_its_own_once_each_in_order():
    assert chosen_buckets(None) == list(range(NUM_BUCKETS))
    assert chosen_buckets([5, 1, 5, 3]) == [1, 3, 5]
    assert chosen_buckets([]) == []


def test_the_policy_is_auto_mixed_or_manual_by_how_many_buckets_are_pinned():
    pins = Pins()
    assert pins.label == "auto"
    pins.pin(G, [2])
    assert pins.label == "mixed" and 2 in pins and 3 not in pins
    pins.pin(S, chosen_buckets(None))
    assert pins.label == "manual" and pins.modes == dict.fromkeys(range(NUM_BUCKETS), S)


def test_pins_lie_over_the_choice_and_leave_other_buckets_to_it():
    choice = list(ModeTable.uniform(A).modes)
    pins = Pins({0: G, 7: S})
    table = pins.over(choice)
    assert table.modes[0] == G and table.modes[7] == S
    assert [table.modes[b] for b in range(NUM_BUCKETS) if b not in (0, 7)] == [A] * (NUM_BUCKETS - 2)
    assert choice == list(ModeTable.uniform(A).modes)  # the choice underneath is kept for `auto`


def test_release_returns_what_the_bucket_was_pinned_to_and_only_once():
    pins = Pins({4: G})
    assert pins.release(4) == G and pins.release(4) is None and pins.label == "auto"
    assert pins.release(9) is None


def test_pins_compare_by_their_buckets_and_modes():
    assert Pins({1: G}) == Pins({1: G}) and Pins({1: G}) != Pins({1: S})
