"""A hooked logits call whose sampler call is still to come: what the gather decided, carried to the sampler.

Every adapter opens one at its hooked gather (`RankHooks.open_call`) and takes it back at the engine's sampler
(`RankHooks.take_call`); each engine's hooks read only the fields its routes fill.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gatherwise.engine_hooks.adapters.batch_verdict import Sampler
from gatherwise.engine_hooks.sampling_params import SamplingRow
from gatherwise.modes import Mode


@dataclass(slots=True)
class OpenCall:
    mode: Mode  # the mode the call runs
    sampler: Sampler  # who samples it
    rows: int  # logits rows the collective exchanged
    tokens: torch.Tensor | None = None  # every rank's tokens, drawn at the gather already
    shards: torch.Tensor | None = None  # what the sampler call draws from, where gatherwise draws it there
    sampled_rows: list[SamplingRow] | None = None  # gatherwise's sampler rows of such a draw
    kind: int = 0  # gatherwise.call_kind, for a call the sampler hook records
    t_start: int = 0  # when the call started, for a call the sampler hook records
    draws: bool = False  # the engine's sampler draws from its random generators (gatherwise.engine_hooks.rng_resync)
    real_rows: int | None = None  # a replayed graph exchanged `rows` (padded) rows for this many real ones
