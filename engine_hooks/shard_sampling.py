"""The canonical sampling computations on vocab shards: one definition that every mode runs.

A call's rows are grouped into a plan (`plan`): kind, parameters, row indices — the same on every rank, since
every rank holds the same rows. Each group is sampled in two steps:

1. per shard, from that shard's logits alone: a summary (`summarize`) — greedy: (max, index); top-k: the k
   best (value, index); temperature: the shard max m and mass s = Σ exp((x − m) / T) as a sequential float64
   cumulative sum; top-p and min-p: m, s and the best `top_p_candidates(width)` (min-p alone: m, a placeholder
   for s, the candidates — its threshold needs only the max);
2. across shards, from the P summaries (`combine_*`): tokens; or, for temperature rows, the shard holding the
   drawn position and the target inside it, which only that shard's owner can resolve (`find_in_shard`); or,
   for top-p / min-p rows whose kept tokens the candidates do not cover, a request for the full rows
   (`sample_top_p_rows`).

The all_gather and gather sampler (gatherwise.engine_hooks.sampling) runs step 1 on each shard of the received
[P, B, W] layout; a sharded rank (gatherwise.engine_hooks.sharded_exchange) runs it on its own shard and exchanges the
summaries. Both then run the same step 2 on the same float64 numbers in the same tensor shapes, so the three
modes give the same token bit for bit by construction, not by luck of summation order.

Semantics (exact): greedy takes the largest logit, ties to the lowest vocab index. Sampled rows see the
probabilities p_i ∝ exp(x_i / T) and tokens in canonical order (value desc, index asc); three truncations each
keep a prefix of that order, and the row keeps their intersection (the shortest of the three prefixes):
top-k keeps the first k; top-p the shortest prefix whose mass reaches p (of the whole vocab, or of the top-k
when both are set — min-p does not change the mass top-p is measured against); min-p the tokens with
p_i >= min_p · p_max, decided in float64 on the logit itself as x_i >= M + T · ln(min_p) with M the row max
(the same inequality, monotone in x, so every shard and every candidate list decides a value alike — the
threshold needs only M, which the shard summaries carry). Sampling is an inverse CDF over the kept tokens in
that order, in float64. Every draw is clamped to the last position that carries mass, so a token is always a
real vocab entry with nonzero probability — never a padding column — even when the uniform is within rounding
of 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum

import torch

from gatherwise.engine_hooks.sampling_params import SamplingParams, SamplingRow, row_uniform

TOP_P_CANDIDATES = 64  # per shard at least: enough for the nucleus of a peaked distribution; flat ones fall back
COLUMNS_PER_CANDIDATE = 1024  # wider shards take one more candidate per this many columns (top_p_candidates)
FALLBACK_DOUBLING_LIMIT = 64  # the fallback's candidates grow up to this many times the first, then whole rows
F64 = torch.float64
_NEG_INF = float("-inf")


class Kind(IntEnum):
    GREEDY = 0  # temperature 0
    TOP_K = 1  # temperature > 0, top_k > 0 (top_p optional, applied within the top k)
    FULL = 2  # temperature > 0 only: exact sampling over the whole vocab
    TOP_P = 3  # temperature > 0, top_p < 1 and/or min_p > 0, no top_k: candidates, else the full-row fallback


def kind_of(params: SamplingParams) -> Kind:
    if params.greedy:
        return Kind.GREEDY
    if params.top_k:
        return Kind.TOP_K
    return Kind.TOP_P if params.top_p < 1.0 or params.min_p > 0.0 else Kind.FULL


@dataclass(frozen=True)
class Group:
    """Rows of one call sampled together: same kind and (except greedy) the same parameters."""

    kind: Kind
    params: SamplingParams
    rows: tuple[int, ...]
    k: int  # candidates per shard (top-k, top-p), else 0

    @property
    def per_row(self) -> int:
        """float64 words of one row's summary."""
        return {Kind.GREEDY: 2, Kind.TOP_K: 2 * self.k, Kind.FULL: 2, Kind.TOP_P: 2 + 2 * self.k}[self.kind]

    def uniforms(self, rows: list[SamplingRow], device: torch.device) -> torch.Tensor:
        p = self.params
        return to_device([row_uniform(p.seed, rows[i].request_id, rows[i].position) for i in self.rows], F64, device)


def to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list on the device without a synchronization: on CUDA through pinned memory, non-blocking (a
    plain copy from pageable memory makes the host wait for the stream)."""
    host = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host if device.type == "cpu" else host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def plan(rows: list[SamplingRow], width: int) -> list[Group]:
    """The groups of a call, in a fixed order (greedy first, then by first appearance of the parameters)."""
    greedy: list[int] = []
    by_params: dict[SamplingParams, list[int]] = {}
    for i, row in enumerate(rows):
        if row.params.greedy:
            greedy.append(i)
        else:
            by_params.setdefault(row.params, []).append(i)
    groups = [Group(Kind.GREEDY, SamplingParams(), tuple(greedy), 0)] if greedy else []
    for params, idx in by_params.items():
        kind = kind_of(params)
        k = min(params.top_k, width) if kind == Kind.TOP_K else top_p_candidates(width) if kind == Kind.TOP_P else 0
        groups.append(Group(kind, params, tuple(idx), k))
    return groups


def top_p_candidates(width: int) -> int:
    """How many candidates a shard of `width` columns sends per top-p / min-p row: TOP_P_CANDIDATES, and one per
    COLUMNS_PER_CANDIDATE columns on wider shards. A row whose kept tokens a shard's candidates miss falls back:
    the whole shard rows cross the wire and are cut and sorted, a cost that grows with the width, while a longer
    top-k costs little more on a wide shard (Gemma-3-270M at TP 2, 131 072 columns: 128 candidates leave 2 % of
    its T 0.8 rows to the fallback instead of 13 %; SmolLM2 at TP 3, 16 384 columns, keeps 64, where twice as many
    cost more than the rows they save). The same on every rank: it depends on the width alone."""
    return min(max(TOP_P_CANDIDATES, width // COLUMNS_PER_CANDIDATE), width)


def is_every_row(rows: tuple[int, ...], batch: int) -> bool:
    """The group is the whole call in order: its rows need no index (no copy, no scatter of its tokens)."""
    return len(rows) == batch and rows == tuple(range(batch))


def token_slots(group: Group, batch: int, device: torch.device) -> slice | torch.Tensor:
    """Where a group's tokens go in the call's tokens [B]: all of them (a slice, so no index tensor is copied to
    the device and no scatter runs) or an index of its rows. Top-p rows index subsets of their group, so they
    always get an index."""
    if group.kind != Kind.TOP_P and is_every_row(group.rows, batch):
        return slice(None)
    return to_device(list(group.rows), torch.int64, device)


def select_rows(shard: torch.Tensor, rows: tuple[int, ...]) -> torch.Tensor:
    """The group's rows of one shard [B, width] -> [n, width]: the shard itself when the group is every row in
    order (no copy), else a contiguous copy. Every mode selects the same way, so a summary sees the same tensor."""
    if is_every_row(rows, shard.shape[0]):
        return shard
    return shard.index_select(0, to_device(list(rows), torch.int64, shard.device))


# -- step 1: one shard ---------------------------------------------------------------------------------------
def summarize(group: Group, x: torch.Tensor, shard: int, width: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The summary [n, per_row] float64 of shard `shard` for the group's rows `x` [n, width] (padding at -inf),
    and, for temperature rows, the shard's cumulative masses [n, width] that `find_in_shard` searches."""
    kind = group.kind
    if kind == Kind.GREEDY:
        local = first_argmax(x)
        values = x.gather(1, local[:, None]).squeeze(1)
        return torch.stack((values.to(F64), (local + shard * width).to(F64)), dim=1), None
    if kind == Kind.TOP_K:
        vals, local = shard_top(x, group.k)
        return torch.cat((vals, (local + shard * width).to(F64)), dim=1), None
    if kind == Kind.TOP_P and group.params.top_p == 1.0:
        # min-p alone measures nothing against the mass: the max decides it, s is a placeholder (1)
        m = x.amax(dim=1).to(F64)
        vals, local = shard_top(x, group.k)
        return torch.cat((torch.stack((m, torch.ones_like(m)), dim=1), vals, (local + shard * width).to(F64)),
                         dim=1), None
    m, cum = shard_mass(x, group.params.temperature)
    stats = torch.stack((m, cum[:, -1]), dim=1)
    if kind == Kind.FULL:
        return stats, cum
    vals, local = shard_top(x, group.k)
    return torch.cat((stats, vals, (local + shard * width).to(F64)), dim=1), None


def first_argmax(x: torch.Tensor) -> torch.Tensor:
    """Column of the first maximum of each row [n, width] -> [n] (lowest index on ties). On CUDA one argmax
    (documented to return the first maximal index; one kernel launch where launches are the cost). Elsewhere
    blocked: a vectorized max per block of columns, then argmax over the block maxima (the first block holding
    the maximum) and inside that block — an order of magnitude faster on CPU than one argmax over the row."""
    if x.is_cuda:
        return x.argmax(dim=1)
    n, width = x.shape
    block = next(b for b in (128, 64, 32, 16, 8, 4, 2, 1) if width % b == 0)
    blocks = x.view(n, width // block, block) if x.is_contiguous() else x.reshape(n, width // block, block)
    best = blocks.amax(dim=2).argmax(dim=1)
    inside = blocks[torch.arange(n, device=x.device), best].argmax(dim=1)
    return best * block + inside


def shard_mass(x: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Shard max m [n] and cumulative masses exp((x − m) / T), summed left to right in float64 [n, width].

    The last column is the shard mass s. A sequential cumulative sum (not a reduction, whose order is the
    kernel's business) is what makes s the exact end of the curve the owner later searches. One float64 buffer,
    written in place: x converted (float32, bfloat16 and float16 are all exact in float64), then each step in
    place, without the fresh buffers (and their page faults) of out-of-place steps. The conversion is its own
    pass: a subtraction that promotes x on the fly gives the same numbers through torch's slower mixed-dtype
    loop (the whole curve of 32 x 131 072 float32 logits: 57 ms that way on one CPU thread, 40 ms this way)."""
    m = x.amax(dim=1).to(F64)  # the max of the shard is one of its values: exact in either dtype
    ref = m.masked_fill(m == _NEG_INF, 0.0)  # an all-padding shard: exp(-inf) = 0 mass, not NaN
    mass = x.to(F64, copy=True).sub_(ref[:, None])  # a copy even of float64 logits: the steps run in place
    return m, mass.div_(temperature).exp_().cumsum_(dim=1)


def shard_top(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best of each row of one shard by (value desc, index asc): float64 values and local ids [n, k].

    Two exact ways to the same set: on CUDA one top-k over keys that have no ties (the host never looks at the
    data); elsewhere a float top-k whose border ties are rebuilt on the host (rare, and ~10x faster on CPU,
    where reading a value costs no synchronization). Callers order candidates canonically themselves
    (`merge_candidates`), so only the set matters."""
    if x.is_cuda:
        return canonical_top(x, k)
    width = x.shape[1]
    vals, local = x.topk(min(k + 1, width), dim=1)
    # When the (k+1)-th value equals the k-th, topk chose among ties at the border and may have kept a later
    # index: rebuild such rows exactly (rare). Otherwise the k best are exactly the values >= the k-th.
    short = (vals[:, k] == vals[:, k - 1]).nonzero().flatten().tolist() if k < width else []
    vals, local = vals[:, :k], local[:, :k]
    if short:
        vals, local = vals.clone(), local.clone()
        for b in short:
            order = x[b].argsort(descending=True, stable=True)[:k]
            vals[b], local[b] = x[b, order], order
    return vals.to(F64), local


_LOW_31 = 0x7FFFFFFF
_INDEX_BITS = 32


def canonical_top(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`shard_top` without a data-dependent step: a float32's bits, negatives' magnitude bits flipped, order like
    the floats (−0.0 folded into +0.0 first); shifted up and joined with (width − 1 − index) they make int64 keys
    ordered by (value desc, index asc) with no ties, so one top-k is exact. Logits are float32, bfloat16 or
    float16: all exact in float32."""
    width = x.shape[1]
    k = min(k, width)
    bits = (x.float() + 0.0).view(torch.int32).to(torch.int64)
    key = torch.where(bits < 0, bits ^ _LOW_31, bits)
    reverse_index = torch.arange(width - 1, -1, -1, dtype=torch.int64, device=x.device)
    local = ((key << _INDEX_BITS) | reverse_index).topk(k, dim=1).indices
    return x.gather(1, local).to(F64), local


# -- step 2: across shards -----------------------------------------------------------------------------------
def combine_greedy(summaries: torch.Tensor) -> torch.Tensor:
    """[P, n, 2] -> tokens [n]: the largest value, the first shard on ties (its ids are the lowest)."""
    best = summaries[:, :, 0].argmax(dim=0, keepdim=True)
    return summaries[:, :, 1].gather(0, best).squeeze(0).to(torch.int64)


def merge_candidates(vals: torch.Tensor, ids: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-shard candidates [P, n, kc] (float64 values, global ids) -> the k best of the row [n, k], ordered by
    (value desc, index asc). Exact: each shard's k best contain every member of the row's k best it holds."""
    n = vals.shape[1]
    v = vals.permute(1, 0, 2).reshape(n, -1)
    i = ids.permute(1, 0, 2).reshape(n, -1).to(torch.int64)
    order = i.argsort(dim=1, stable=True)
    v, i = v.gather(1, order), i.gather(1, order)
    order = v.argsort(dim=1, descending=True, stable=True)[:, :k]
    return v.gather(1, order), i.gather(1, order)


def draw_candidates(vals: torch.Tensor, ids: torch.Tensor, params: SamplingParams, u: torch.Tensor,
                    top: torch.Tensor | None = None, total: torch.Tensor | None = None) -> torch.Tensor:
    """Inverse CDF over candidates in canonical order [n, K]. `top` is the row max (default: the first
    candidate) and `total` the mass top-p is measured against (default: the candidates' own mass)."""
    top = vals[:, 0] if top is None else top
    probs = torch.exp((vals - top[:, None]) / params.temperature)
    cum = probs.cumsum(dim=1)
    if params.top_p < 1.0 or params.min_p > 0.0:
        total = cum[:, -1] if total is None else total
        mass = cum.gather(1, kept_count(vals, cum, params, top, total) - 1)
    else:
        mass = cum[:, -1:]
    return ids.gather(1, _clamped_search(cum, u[:, None] * mass, mass)).squeeze(1)


def kept_count(vals: torch.Tensor, cum: torch.Tensor, params: SamplingParams, top: torch.Tensor,
               total: torch.Tensor) -> torch.Tensor:
    """How many of the candidates [n, K] (canonical order, cumulative masses `cum`) a row keeps [n, 1]: the top-p
    prefix cut to the min-p prefix; at least the first (the max itself passes every truncation)."""
    kept = torch.full_like(cum[:, :1], cum.shape[1], dtype=torch.int64)
    if params.top_p < 1.0:
        before = torch.cat((torch.zeros_like(cum[:, :1]), cum[:, :-1]), dim=1)  # mass strictly before each
        kept = (before < params.top_p * total[:, None]).sum(dim=1, keepdim=True)
    if params.min_p > 0.0:
        kept = torch.minimum(kept, (vals >= min_p_cutoff(params, top)[:, None]).sum(dim=1, keepdim=True))
    return kept.clamp_(min=1)


def min_p_cutoff(params: SamplingParams, top: torch.Tensor) -> torch.Tensor:
    """The smallest logit min-p keeps [n], float64: p_i >= min_p · p_max  <=>  x_i >= M + T · ln(min_p)."""
    return top + params.temperature * math.log(params.min_p)


def nucleus_covered(vals: torch.Tensor, params: SamplingParams, top: torch.Tensor, total: torch.Tensor
                    ) -> torch.Tensor:
    """Whether a row's kept tokens all lie among its candidates [n, K] — the row's K best in canonical order,
    whatever follows them ranks after the last [n] bool: their mass reaches top_p of the total (the top-p
    prefix ends inside), or the last candidate already fails min-p (so does everything after it)."""
    covered = top_p_reached(vals, params, top, total)
    if params.min_p > 0.0:
        covered |= vals[:, -1] < min_p_cutoff(params, top)
    return covered


def top_p_reached(vals: torch.Tensor, params: SamplingParams, top: torch.Tensor, total: torch.Tensor
                  ) -> torch.Tensor:
    """Whether candidates [n, K] in canonical order reach top_p of the total with the cumulative masses
    draw_candidates computes [n] bool (False for rows without top-p)."""
    if params.top_p >= 1.0:
        return torch.zeros(vals.shape[0], dtype=torch.bool, device=vals.device)
    mass = torch.exp((vals - top[:, None]) / params.temperature).cumsum(dim=1)[:, -1]
    return mass >= params.top_p * total


def _clamped_search(cum: torch.Tensor, target: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """First position whose cumulative mass exceeds target, but never past the first position that reaches
    `mass` — the last one carrying mass. Rounding can put target at or above mass when u is within a few
    ulps of 1; a plain search would then run past the kept tokens into zero-mass or padding columns."""
    pick = torch.searchsorted(cum, target.contiguous(), right=True)
    last = torch.searchsorted(cum, mass.contiguous(), right=False)
    return torch.minimum(pick, last)


def combine_top_k(group: Group, summaries: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    k = group.k
    num_shards = summaries.shape[0]
    vals, ids = merge_candidates(summaries[:, :, :k], summaries[:, :, k:], min(group.params.top_k, num_shards * k))
    return draw_candidates(vals, ids, group.params, u)


@dataclass
class MassDraw:
    """Where the drawn position of each temperature row lies: shard, target inside it (in units of that
    shard's own cumulative masses), plus the row max and total mass (top-p needs them)."""

    shard: torch.Tensor  # [n] int64
    target: torch.Tensor  # [n] float64
    top: torch.Tensor  # [n] float64
    total: torch.Tensor  # [n] float64

    def select(self, index: torch.Tensor) -> MassDraw:
        return MassDraw(self.shard[index], self.target[index], self.top[index], self.total[index])


def draw_shard(m: torch.Tensor, s: torch.Tensor, temperature: float, u: torch.Tensor) -> MassDraw:
    """From every shard's (max [P, n], mass [P, n]): the row max M, the shard masses s·exp((m − M) / T) summed
    over shards in rank order, and the drawn shard and in-shard target for uniforms u [n]."""
    top = m.amax(dim=0)
    scale = torch.where(m == _NEG_INF, 0.0, torch.exp((m - top) / temperature))
    cum = (s * scale).cumsum(dim=0).T.contiguous()  # [n, P]
    total = cum[:, -1].contiguous()
    target = u * total
    shard = _clamped_search(cum, target[:, None], total[:, None])  # [n, 1]
    before = torch.where(shard > 0, cum.gather(1, (shard - 1).clamp(min=0)), 0.0)
    inside = (target[:, None] - before) / scale.T.gather(1, shard)
    return MassDraw(shard.squeeze(1), inside.squeeze(1), top, total)


def find_in_shard(cum: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The owner's half of a temperature draw: local column [n] for targets [n] in its cumulative masses."""
    return _clamped_search(cum, target[:, None], cum[:, -1:]).squeeze(1)


def top_p_covered(group: Group, summaries: torch.Tensor, draw: MassDraw, width: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-p / min-p rows from their summaries: (merged candidates' values, ids, covered [n] bool). A row is
    covered when its kept tokens are among its candidates (`nucleus_covered`) or they are the whole row."""
    k, num_shards = group.k, summaries.shape[0]
    whole = k == width  # every shard sent all its columns: the merged list is the whole row
    vals, ids = merge_candidates(summaries[:, :, 2:2 + k], summaries[:, :, 2 + k:], num_shards * k if whole else k)
    if whole:
        return vals, ids, torch.ones(vals.shape[0], dtype=torch.bool, device=vals.device)
    return vals, ids, nucleus_covered(vals, group.params, draw.top, draw.total)


def sample_top_p_rows(group: Group, x: torch.Tensor, draw: MassDraw, u: torch.Tensor, width: int) -> torch.Tensor:
    """The fallback for top-p / min-p rows the candidates did not cover, from their full rows x [P, n, width]:
    each row cut at a logit (`nucleus_cut`) CUT_DEPTHS[0] · T below its max, deeper while that misses, and drawn
    from its tokens at or above the cut when they hold the kept tokens — their mass reaches top_p of the total,
    or the cut is at or below min-p's cutoff. The tokens at or above a value are a prefix of the row's canonical
    order, and a prefix's cumulative masses are the same whatever follows it: the token is the one the whole
    sorted row gives, from a sort of the prefix only. Rows no cut holds (a flat row's nucleus deeper than the
    last) take `candidate_rounds`."""
    n, params = x.shape[1], group.params
    tokens = torch.empty(n, dtype=torch.int64, device=x.device)
    missed: list[int] = []
    for j in range(n):
        top, total = draw.top[j:j + 1], draw.total[j:j + 1]
        cutoff = float(min_p_cutoff(params, top)) if params.min_p > 0.0 else _NEG_INF
        for depth in CUT_DEPTHS:
            limit = max(float(top) - depth * params.temperature, cutoff)
            vals, ids = nucleus_cut(x[:, j, :], limit, width)
            if limit == cutoff or bool(top_p_reached(vals, params, top, total)):
                tokens[j:j + 1] = draw_candidates(vals, ids, params, u[j:j + 1], top, total)
                break
        else:
            missed.append(j)
    if missed:
        rows = to_device(missed, torch.int64, x.device)
        tokens[rows] = candidate_rounds(group, x.index_select(1, rows), draw.select(rows), u[rows], width)
    return tokens


# where a trained model's top-p 0.95 nucleus ends: within 9.5 T of the row max on each of the 1 536 real rows of
# docs/models.md (SmolLM2, Gemma-3-270M, T 0.8 and 1.0), whose tokens within 10 T are at most 14 % of the row
# (median under 0.4 %); a flat row's nucleus goes on to the next depth
CUT_DEPTHS = (10.0, 20.0)


def nucleus_cut(row: torch.Tensor, limit: float, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens of one row's shards [P, width] at or above `limit`, in canonical order: float64 values and
    global ids [1, K] — every token whose logit is >= limit in float64, and maybe ties just below it (a prefix
    still): the comparison rounds the limit to the logits' dtype, to one of its two neighbours there, and a
    logit >= limit is >= both."""
    keep = row >= limit
    where = keep.nonzero()  # (shard, column), row-major: ascending global id
    values = row[where[:, 0], where[:, 1]]
    order = values.argsort(descending=True, stable=True)  # value desc, ties in index order
    ids = where[:, 0] * width + where[:, 1]
    return values[order].to(F64)[None], ids[order][None]


def candidate_rounds(group: Group, x: torch.Tensor, draw: MassDraw, u: torch.Tensor, width: int) -> torch.Tensor:
    """Rows x [P, n, width] by rounds of candidates: the exact best k of each row, k growing until every row's
    kept tokens are inside (`next_candidates`), the whole row once k passes FALLBACK_DOUBLING_LIMIT times the
    candidates or a quarter of the row. A row's token does not depend on the k it finished at."""
    num_shards, n = x.shape[0], x.shape[1]
    row_width = num_shards * width
    tokens = torch.empty(n, dtype=torch.int64, device=x.device)
    pending = torch.arange(n, device=x.device)
    k = min(2 * group.k, row_width)
    if group.params.min_p > 0.0:  # min-p's kept count is known exactly: size the first round to it
        k = max(k, min(int(min_p_kept(x, group.params, draw.top).max()) + 1, row_width))
    while pending.numel():
        # a nucleus past 64x the candidates is most likely a flat row's, most of the vocab: one sort of the whole
        # row (~10 ms at 152k columns on one CPU thread) costs less than the rounds up to it; so does any k
        # past a quarter of the row
        if k > FALLBACK_DOUBLING_LIMIT * group.k or 4 * k > row_width:
            k = row_width
        rows = x if pending.numel() == n else x.index_select(1, pending)
        if k == row_width:
            vals, ids = whole_rows(rows)
        else:
            per_shard = [shard_top(rows[r], min(k, width)) for r in range(num_shards)]
            vals = torch.stack([v for v, _ in per_shard])
            ids = torch.stack([(local + r * width) for r, (_, local) in enumerate(per_shard)])
            vals, ids = merge_candidates(vals, ids, k)
        top, total, pu = draw.top[pending], draw.total[pending], u[pending]
        if k == row_width:
            done = torch.ones(pending.numel(), dtype=torch.bool, device=x.device)
        else:
            done = nucleus_covered(vals, group.params, top, total)
        if bool(done.any()):
            tokens[pending[done]] = draw_candidates(vals[done], ids[done], group.params, pu[done], top[done],
                                                    total[done])
        if not bool(done.all()):
            k = next_candidates(vals[~done], group.params, top[~done], total[~done])
        pending = pending[~done]
    return tokens


def min_p_kept(x: torch.Tensor, params: SamplingParams, top: torch.Tensor) -> torch.Tensor:
    """How many tokens min-p keeps in each of the rows x [P, n, width] [n]: the count of logits at or above the
    cutoff, decided in float64 as kept_count decides it."""
    cutoff = min_p_cutoff(params, top)[None, :, None]
    return (x.to(F64) >= cutoff).sum(dim=(0, 2))


def next_candidates(vals: torch.Tensor, params: SamplingParams, top: torch.Tensor, total: torch.Tensor) -> int:
    """How many candidates the next fallback round takes for rows whose kept tokens lie past their K candidates
    vals [n, K]: at least twice K, and for top-p at least as many as could reach p of the total — every token
    after the K-th weighs at most the K-th, so fewer than K + (p·total − mass of the K) / weight of the K-th
    cannot. A flat row's bound is most of the vocab: it goes to the whole-row sort in one step."""
    k = vals.shape[1]
    if params.top_p >= 1.0:
        return 2 * k
    weights = torch.exp((vals - top[:, None]) / params.temperature)
    missing = params.top_p * total - weights.sum(dim=1)
    bound = k + missing / weights[:, -1].clamp(min=torch.finfo(F64).tiny)
    return max(2 * k, int(min(float(bound.max()), float(1 << 40))))


def whole_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every column of the rows x [P, n, width] in canonical order (value desc, index asc): float64 values and
    global ids [n, P·width]. What merge_candidates gives for candidates that are whole shards, in one stable
    sort: the shards side by side are already in index order."""
    v = x.permute(1, 0, 2).reshape(x.shape[1], -1)
    # sorted in the logits' own dtype: widening to float64 is exact and keeps order and ties, and the narrow
    # sort is the faster one
    order = v.argsort(dim=1, descending=True, stable=True)
    return v.gather(1, order).to(F64), order

