"""The sampler's distribution is the exact target, by goodness-of-fit tests — and the tests can tell a biased one.

Each case draws N tokens from gatherwise's sampler over fixed logits split into P = 3 shards (odd vocab: the last
shard has padding), one independent stream per draw (request id and position vary the counter-based uniform).
The target is computed separately, in float64, from the same logits and the semantics documented in
gatherwise.engine_hooks.shard_sampling: canonical order (value desc, index asc); top-k keeps the first k; top-p
the shortest prefix whose mass reaches p (of the vocab, or of the top-k); min-p the tokens with
x >= M + T·ln(min_p); the row keeps the intersection. A Pearson chi-square over the kept tokens (consecutive
tokens pooled until each bin expects >= 5 draws) must not reject at ALPHA family-wise (Bonferroni over the
cases), and no token outside the kept set may ever appear. The uniforms are fixed by the seeds, so the verdicts
are deterministic. The same test must reject deliberately biased samplers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

import gatherwise.engine_hooks.sampling as sampling
from gatherwise.engine_hooks.logits_path import shard_width
from gatherwise.engine_hooks.sampling import SamplingParams, SamplingRow, sample
from gatherwise.engine_hooks.shard_sampling import TOP_P_CANDIDATES

ALPHA = 1e-3  # family-wise: the chance that a correct sampler fails this file, once, at design time
WORLD = 3
DRAWS = 30_000
CHUNK = 10_000  # rows per sampler call: keeps the float64 shard masses small
MIN_EXPECTED = 5.0
MARGIN = 1e-9  # the oracle refuses logits where a truncation boundary is within rounding of a decision


def gaussian_logits(vocab: int, scale: float, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(vocab, generator=gen, dtype=torch.float64).mul_(scale).to(torch.float32)


PEAKED = gaussian_logits(301, 2.5, 1)  # nuclei of a few to a few dozen tokens: inside the candidates
FLAT = gaussian_logits(601, 0.4, 2)  # nuclei of hundreds: beyond TOP_P_CANDIDATES, the full-row fallback


@dataclass(frozen=True)
class Case:
    name: str
    params: SamplingParams
    logits: torch.Tensor
    falls_back: bool = False  # the kept set is larger than the candidates: rows take the full-row fallback


CASES = [
    Case("temperature 1", SamplingParams(temperature=1.0, seed=11), PEAKED),
    Case("temperature 0.6", SamplingParams(temperature=0.6, seed=12), PEAKED),
    Case("temperature 1.7", SamplingParams(temperature=1.7, seed=13), PEAKED),
    Case("top-k 20", SamplingParams(temperature=0.9, top_k=20, seed=14), PEAKED),
    Case("top-p 0.9", SamplingParams(temperature=0.8, top_p=0.9, seed=15), PEAKED),
    Case("min-p 0.05", SamplingParams(temperature=1.0, min_p=0.05, seed=16), PEAKED),
    Case("top-k 50 + top-p 0.8", SamplingParams(temperature=1.2, top_k=50, top_p=0.8, seed=17), PEAKED),
    Case("top-p 0.95 + min-p 0.02", SamplingParams(temperature=0.8, top_p=0.95, min_p=0.02, seed=18), PEAKED),
    Case("top-k 40 + min-p 0.1", SamplingParams(temperature=1.3, top_k=40, min_p=0.1, seed=19), PEAKED),
    Case("top-p 0.95 fallback", SamplingParams(temperature=0.8, top_p=0.95, seed=20), FLAT, falls_back=True),
    Case("min-p 0.3 fallback", SamplingParams(temperature=1.0, min_p=0.3, seed=21), FLAT, falls_back=True),
]
CASE_ALPHA = ALPHA / len(CASES)


def kept_target(logits: torch.Tensor, params: SamplingParams) -> tuple[list[int], torch.Tensor]:
    """The exact target: kept token ids in canonical order and their probabilities (float64, summing to 1)."""
    x = logits.to(torch.float64).tolist()
    order = sorted(range(len(x)), key=lambda i: (-x[i], i))
    top, t = x[order[0]], params.temperature
    weight = [math.exp((x[i] - top) / t) for i in order]
    kept = len(order)
    if params.top_k:
        kept = min(kept, params.top_k)
    if params.top_p < 1.0:
        reference = math.fsum(weight[:kept])  # the whole vocab, or the top-k when both are set
        cum = 0.0
        for j, w in enumerate(weight[:kept]):
            cum += w
            if cum >= params.top_p * reference:
                assert cum - params.top_p * reference > MARGIN and params.top_p * reference - (cum - w) > MARGIN
                kept = j + 1
                break
    if params.min_p > 0.0:
        cutoff = top + t * math.log(params.min_p)
        assert all(abs(x[i] - cutoff) > MARGIN for i in order)
        kept = min(kept, sum(x[i] >= cutoff for i in order))
    probs = torch.tensor(weight[:kept], dtype=torch.float64)
    return order[:kept], probs / probs.sum()


def shards_of(logits: torch.Tensor, rows: int) -> torch.Tensor:
    """One logits row as the received layout [P, rows, width] (padding at -inf), the row repeated without a copy."""
    vocab = logits.numel()
    width = shard_width(vocab, WORLD)
    padded = logits.new_full((WORLD * width,), float("-inf"))
    padded[:vocab] = logits
    return padded.view(WORLD, 1, width).expand(WORLD, rows, width)


def draw(case: Case, params: SamplingParams | None = None, logits: torch.Tensor | None = None,
         draws: int = DRAWS) -> torch.Tensor:
    """Token counts [vocab] of `draws` independent draws (request id and position differ on every row)."""
    params = case.params if params is None else params
    logits = case.logits if logits is None else logits
    counts = torch.zeros(logits.numel(), dtype=torch.int64)
    for start in range(0, draws, CHUNK):
        n = min(CHUNK, draws - start)
        rows = [SamplingRow(params, request_id=start + i, position=(start + i) * 7 + 3) for i in range(n)]
        counts += torch.bincount(sample(shards_of(logits, n), logits.numel(), rows), minlength=logits.numel())
    return counts


def chi_square_p_value(statistic: float, dof: int) -> float:
    """Upper tail of the chi-square distribution: the regularized upper incomplete gamma Q(dof/2, x/2)."""
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))


@dataclass(frozen=True)
class Fit:
    p_value: float
    bins: int
    outside: int  # draws of tokens the target never keeps


def goodness_of_fit(counts: torch.Tensor, kept: list[int], probs: torch.Tensor) -> Fit:
    """Pearson chi-square of the draws against the target, consecutive kept tokens (canonical order) pooled
    until each bin expects >= MIN_EXPECTED draws; the last, short bin joins the one before it."""
    total = int(counts.sum())
    observed, expected = counts[kept].to(torch.float64), probs * total
    bins_o, bins_e, acc_o, acc_e = [], [], 0.0, 0.0
    for o, e in zip(observed.tolist(), expected.tolist(), strict=True):
        acc_o, acc_e = acc_o + o, acc_e + e
        if acc_e >= MIN_EXPECTED:
            bins_o.append(acc_o)
            bins_e.append(acc_e)
            acc_o = acc_e = 0.0
    if acc_e > 0.0:
        if bins_e:
            bins_o[-1] += acc_o
            bins_e[-1] += acc_e
        else:
            bins_o, bins_e = [acc_o], [acc_e]
    outside = total - int(observed.sum())
    if len(bins_e) < 2:  # one bin (a single kept token): nothing to fit, only the support to check
        return Fit(1.0, len(bins_e), outside)
    o, e = torch.tensor(bins_o), torch.tensor(bins_e, dtype=torch.float64)
    statistic = float(((o - e) ** 2 / e).sum())
    return Fit(chi_square_p_value(statistic, len(bins_e) - 1), len(bins_e), outside)


@pytest.fixture
def fallback_rows(monkeypatch):
    """How many rows the sampler sent to the full-row fallback (the real function, counted)."""
    seen = [0]
    real = sampling.sample_top_p_rows

    def counted(group, x, draw_, u, width):
        seen[0] += x.shape[1]
        return real(group, x, draw_, u, width)

    monkeypatch.setattr(sampling, "sample_top_p_rows", counted)
    return seen


def test_the_chi_square_tail_matches_reference_values():
    # reference values of the chi-square survival function (scipy.stats.chi2.sf)
    for statistic, dof, want in ((10.828, 1, 0.0009997657195830916), (124.342, 100, 0.05000071576997178),
                                 (3.0, 5, 0.6999858358786276), (1500.0, 1400, 0.031503720989392366)):
        assert chi_square_p_value(statistic, dof) == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_draws_follow_the_exact_target(case, fallback_rows):
    kept, probs = kept_target(case.logits, case.params)
    counts = draw(case)
    fit = goodness_of_fit(counts, kept, probs)
    assert fit.outside == 0, f"{case.name}: {fit.outside} draws of tokens outside the {len(kept)} kept"
    assert fit.bins >= 2 or len(kept) == 1
    assert fit.p_value >= CASE_ALPHA, f"{case.name}: chi-square p = {fit.p_value:.3g} over {fit.bins} bins"
    if case.falls_back:  # the case exercises what it is named for
        assert len(kept) > TOP_P_CANDIDATES and fallback_rows[0] == DRAWS
    else:
        assert fallback_rows[0] == 0


def test_the_cases_cover_small_and_large_kept_sets():
    sizes = {c.name: len(kept_target(c.logits, c.params)[0]) for c in CASES}
    assert sizes["top-k 20"] == 20 and sizes["top-k 40 + min-p 0.1"] < 40  # min-p is the shorter cut there
    assert 1 < sizes["min-p 0.05"] < sizes["temperature 1"] == PEAKED.numel()
    assert sizes["top-p 0.95 + min-p 0.02"] < len(kept_target(PEAKED, SamplingParams(0.8, top_p=0.95))[0])
    assert sizes["top-p 0.95 fallback"] > 4 * TOP_P_CANDIDATES


def test_temperature_applied_twice_is_rejected():
    case = next(c for c in CASES if c.name == "temperature 0.6")
    kept, probs = kept_target(case.logits, case.params)
    biased = draw(case, logits=case.logits / case.params.temperature)  # the sampler divides by T once more
    fit = goodness_of_fit(biased, kept, probs)
    assert fit.outside == 0 and fit.p_value < CASE_ALPHA, fit


def test_a_top_p_threshold_one_token_short_is_rejected():
    """The biased sampler keeps the nucleus minus its last token (a threshold one token early): the target's
    last token never appears and the rest are inflated; the chi-square must see it. (At the tail of a nucleus of
    hundreds the same bias moves too little mass for DRAWS draws to see: the power is stated, not claimed.)"""
    case = next(c for c in CASES if c.name == "top-p 0.9")
    kept, probs = kept_target(case.logits, case.params)
    weights = torch.exp((case.logits.double()[kept] - case.logits.double().max()) / case.params.temperature)
    reference = torch.exp((case.logits.double() - case.logits.double().max()) / case.params.temperature).sum()
    short_p = float(weights[:-1].sum() / reference) - 1e-6  # reached one token earlier
    biased_params = SamplingParams(case.params.temperature, top_p=short_p, seed=case.params.seed)
    assert len(kept_target(case.logits, biased_params)[0]) == len(kept) - 1
    fit = goodness_of_fit(draw(case, biased_params), kept, probs)
    assert fit.p_value < CASE_ALPHA, fit


def test_a_nucleus_cut_to_the_candidates_is_rejected():
    """The bug a fallback guards against: rows whose nucleus does not fit the candidates sampled from the
    candidates anyway (top-p then measured against the candidates' own mass)."""
    case = next(c for c in CASES if c.name == "top-p 0.95 fallback")
    kept, probs = kept_target(case.logits, case.params)
    biased_params = SamplingParams(case.params.temperature, top_k=TOP_P_CANDIDATES, top_p=case.params.top_p,
                                   seed=case.params.seed)
    fit = goodness_of_fit(draw(case, biased_params), kept, probs)
    assert fit.outside == 0 and fit.p_value < CASE_ALPHA, fit


def test_a_top_p_threshold_one_token_long_is_caught_by_the_support():
    case = next(c for c in CASES if c.name == "top-p 0.9")
    kept, probs = kept_target(case.logits, case.params)
    weights = torch.exp((case.logits.double().sort(descending=True).values - case.logits.double().max())
                        / case.params.temperature)
    long_p = float(weights[:len(kept) + 1].sum() / weights.sum()) - 1e-6  # one more token before it is reached
    biased_params = SamplingParams(case.params.temperature, top_p=long_p, seed=case.params.seed)
    assert len(kept_target(case.logits, biased_params)[0]) == len(kept) + 1
    fit = goodness_of_fit(draw(case, biased_params), kept, probs)
    assert fit.outside > 0, fit


def test_min_p_measured_against_the_wrong_max_is_rejected():
    """min-p against the shard's own max instead of the row's (the mistake a per-shard filter would make): a
    cutoff too low on every shard but the max's, so tokens outside the kept set appear."""
    case = next(c for c in CASES if c.name == "min-p 0.05")
    kept, probs = kept_target(case.logits, case.params)
    width = shard_width(case.logits.numel(), WORLD)
    x = case.logits.double()
    cutoffs = torch.stack([x[r * width:(r + 1) * width].max() for r in range(WORLD)]) + math.log(0.05)
    per_shard = x.new_full((WORLD * width,), float("-inf"))
    per_shard[:x.numel()] = x
    per_shard = per_shard.view(WORLD, width)
    survivors = torch.where(per_shard >= cutoffs[:, None], per_shard, float("-inf")).reshape(-1)[:x.numel()]
    biased = draw(case, SamplingParams(1.0, seed=case.params.seed), survivors.to(torch.float32))
    fit = goodness_of_fit(biased, kept, probs)
    assert fit.outside > 0 or fit.p_value < CASE_ALPHA, fit
