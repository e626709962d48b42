"""The rows gatherwise's own sampler draws for an engine's sampled batch under `engine.sampler: gatherwise`.

A row's tokens depend only on its parameters and its key (seed, request id, position): never on the mode, the
batch it shares a step with, or the calls before it. A request that set its own seed is keyed by that seed
alone, so the same seed and prompt give the same tokens in every run, as users expect of a seed; any other
request by `engine.sampler_seed` and a stable hash of the engine's request id, so concurrent requests (n > 1
samples of one prompt included) draw independently.
"""

from __future__ import annotations

from gatherwise.config import GatherwiseConfig
from gatherwise.engine_hooks.sampling_params import SamplingParams, SamplingRow
from gatherwise.stable_hash import stable_hash

SEEDED_REQUEST = 0  # the request id of every request that brought its own seed: the seed is its key


def gatherwise_samples(config: GatherwiseConfig) -> bool:
    """Whether sampled batches go to gatherwise's sampler in every mode (else the engine's own samples them)."""
    return config.engine.sampler == "gatherwise"


def sampler_row(params: SamplingParams, request_seed: int | None, request_name: str, position: int,
                sampler_seed: int) -> SamplingRow:
    """One row for gatherwise's sampler. `params` without its seed; `position`: the index of the token being
    produced within the request's output (0 for the first)."""
    if request_seed is not None:
        return SamplingRow(_with_seed(params, request_seed), SEEDED_REQUEST, position)
    return SamplingRow(_with_seed(params, sampler_seed), stable_hash(request_name), position)


def _with_seed(params: SamplingParams, seed: int) -> SamplingParams:
    return SamplingParams(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                          seed=seed & ((1 << 64) - 1), min_p=params.min_p)


def sampler_labels(engine: str, gatherwise: bool) -> dict[str, str]:
    """Who samples in each mode under an adapter (the rank info file, `/v1/engine`, the page)."""
    if gatherwise:
        return {"all_gather": "gatherwise sampler (engine.sampler: gatherwise), every rank",
                "gather": "gatherwise sampler (engine.sampler: gatherwise) on rank 0, tokens broadcast",
                "sharded": "gatherwise sharded sampler (engine.sampler: gatherwise)"}
    return {"all_gather": f"{engine}'s sampler, every rank",
            "gather": f"{engine}'s sampler on rank 0, tokens broadcast",
            "sharded": f"gatherwise sharded argmax for greedy batches; other batches all_gather and {engine}'s sampler"}
