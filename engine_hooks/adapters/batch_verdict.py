"""What one batch allows at its hooked logits call, and who samples it: decided once per call, from what every
rank holds alike (the shared table, the broadcast batch), so every rank takes the same route.

Each engine generation's rules fill one `BatchVerdict` from its batch (vllm/v1_batch.py, vllm/v2_batch.py,
sglang/step.py); `route` turns the table's mode and the verdict into who samples and in which mode, the same way
for every engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from gatherwise.engine_hooks.sampling_params import SamplingRow
from gatherwise.modes import Mode


class Sampler(Enum):
    """Who turns a call's logits into tokens."""

    ENGINE = "engine"  # the engine's own sampler, on every rank (all_gather) or on rank 0 (gather)
    ARGMAX = "argmax"  # the sharded argmax of the raw shards: greedy rows whose logits nothing rewrites
    ENGINE_ON_SHARDS = "engine_on_shards"  # the engine's keyed sampler on each shard, the winners exchanged
    GATHERWISE = "gatherwise"  # gatherwise's sampler on the verdict's rows (engine.sampler: gatherwise)


@dataclass(frozen=True)
class BatchVerdict:
    """What a batch may run, and what it samples."""

    kind: int  # gatherwise.call_kind of the batch
    raw_argmax: bool  # every row greedy and nothing rewrites a logit: the token is the argmax of the raw shard
    sharded_reason: str | None  # why the batch cannot be sampled on the shards exactly (None: it can)
    gather_reason: str | None  # why rank 0 alone must not sample it (None: it may)
    rows: list[SamplingRow] | None = None  # gatherwise's sampler takes the batch, with these rows

    def aside_reason(self, mode: Mode) -> str | None:
        """Why a call of this batch steps aside from `mode`, the table's, to all_gather (None: it runs `mode`)."""
        if self.rows is not None:
            return None
        if mode == Mode.SHARDED:
            return None if self.raw_argmax else self.sharded_reason
        return self.gather_reason if mode == Mode.GATHER else None


def route(mode: Mode, verdict: BatchVerdict) -> tuple[Sampler, Mode]:
    """Who samples a call of `verdict`'s batch under the table's `mode`, and the mode the call runs: the table's,
    or all_gather where the batch steps aside (`BatchVerdict.aside_reason`)."""
    if verdict.rows is not None:
        return Sampler.GATHERWISE, mode
    if mode == Mode.SHARDED:
        if verdict.raw_argmax:
            return Sampler.ARGMAX, mode
        if verdict.sharded_reason is None:
            return Sampler.ENGINE_ON_SHARDS, mode
        return Sampler.ENGINE, Mode.ALL_GATHER
    if mode == Mode.GATHER and verdict.gather_reason is not None:
        return Sampler.ENGINE, Mode.ALL_GATHER
    return Sampler.ENGINE, mode
