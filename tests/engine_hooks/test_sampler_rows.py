"""The keys of gatherwise's sampler rows in an engine: a request's own seed is its whole key; other requests are
keyed by the configured seed and their request id."""

from gatherwise.config import GatherwiseConfig
from gatherwise.engine_hooks.adapters.sampler_rows import SEEDED_REQUEST, gatherwise_samples, sampler_row
from gatherwise.engine_hooks.sampling_params import SamplingParams, row_uniform
from gatherwise.stable_hash import stable_hash

TOP_P = SamplingParams(temperature=0.8, top_p=0.95)


def test_a_seeded_request_draws_the_same_whatever_its_request_id() -> None:
    a = sampler_row(TOP_P, 1234, "req-a", 7, sampler_seed=5)
    b = sampler_row(TOP_P, 1234, "req-b", 7, sampler_seed=9)
    assert a == b
    assert (a.params.seed, a.request_id, a.position) == (1234, SEEDED_REQUEST, 7)
    assert (a.params.temperature, a.params.top_p) == (0.8, 0.95)


def test_unseeded_requests_are_keyed_by_the_configured_seed_and_their_id() -> None:
    a = sampler_row(TOP_P, None, "req-a", 3, sampler_seed=5)
    b = sampler_row(TOP_P, None, "req-b", 3, sampler_seed=5)
    assert (a.params.seed, a.request_id) == (5, stable_hash("req-a"))
    assert row_uniform(a.params.seed, a.request_id, 3) != row_uniform(b.params.seed, b.request_id, 3)
    assert sampler_row(TOP_P, None, "req-a", 3, sampler_seed=6).params.seed == 6


def test_the_engines_sampler_is_the_default() -> None:
    assert not gatherwise_samples(GatherwiseConfig())
    assert gatherwise_samples(GatherwiseConfig.model_validate({"engine": {"sampler": "gatherwise"}}))
