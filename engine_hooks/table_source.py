"""Where rank 0 gets requested mode tables from (docs/architecture.md, "Control").

Rank 0 calls `poll(call_index)` once at the start of every logits call, and `report(...)` at the start of the
call from which every rank runs a requested table (ADOPT_LAG calls after the call that carried it: only then is
it applied). Implementations: an in-process object (tests, embedding), a seeded random
schedule (the `schedule:SEED` mode of the CLI), and the shared-memory control block (engine_hooks.control_block).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

from gatherwise.modes import IMPLEMENTED, NUM_BUCKETS, ModeTable


@dataclass(frozen=True)
class TableRequest:
    seq: int  # strictly increasing per source; a new seq is a new request
    table: ModeTable


@dataclass(frozen=True)
class AppliedStatus:
    seq: int  # request seq every rank now runs
    apply_call: int  # the call index from which every rank runs the table
    table: ModeTable
    epoch: int


class TableSource(Protocol):
    def poll(self, call_index: int) -> TableRequest | None:
        """The latest request (None when there is none). Must be cheap: it runs once per call."""

    def report(self, status: AppliedStatus) -> None:
        """Every rank runs request `status.seq` from call `status.apply_call` on, which rank 0 is starting now."""


class InProcessTableSource:
    """A table source driven from the same process (tests, embedding, adapters without shared memory)."""

    def __init__(self) -> None:
        self._request: TableRequest | None = None
        self.applied: list[AppliedStatus] = []

    def request(self, table: ModeTable) -> int:
        seq = (self._request.seq if self._request else 0) + 1
        self._request = TableRequest(seq, table)
        return seq

    def poll(self, call_index: int) -> TableRequest | None:
        return self._request

    def report(self, status: AppliedStatus) -> None:
        self.applied.append(status)


def random_table(rng: random.Random) -> ModeTable:
    return ModeTable(tuple(rng.choice(IMPLEMENTED) for _ in range(NUM_BUCKETS)))


class ScheduleTableSource:
    """A random switch schedule drawn from a seed: at random calls, random buckets change mode."""

    def __init__(self, seed: int, switch_probability: float = 0.3) -> None:
        self._rng = random.Random(seed)
        self._p = switch_probability
        self._request: TableRequest | None = None
        self._table = initial_schedule_table(seed)

    def poll(self, call_index: int) -> TableRequest | None:
        if self._rng.random() < self._p:
            buckets = self._rng.sample(range(NUM_BUCKETS), self._rng.randint(1, NUM_BUCKETS))
            self._table = self._table.with_buckets(self._rng.choice(IMPLEMENTED), buckets)
            seq = (self._request.seq if self._request else 0) + 1
            self._request = TableRequest(seq, self._table)
        return self._request

    def report(self, status: AppliedStatus) -> None:
        pass


# Salts the seed for the starting table, so it is not the first table the schedule itself draws.
_INITIAL_TABLE_SALT = 0x5EED


def initial_schedule_table(seed: int) -> ModeTable:
    """The table every rank starts a `schedule:SEED` run with (derived from the seed alone)."""
    return random_table(random.Random(seed ^ _INITIAL_TABLE_SALT))
