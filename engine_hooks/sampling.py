"""Mode-independent sampling over vocab shards (DESIGN §5).

The sampler reads the received layout `[P, B, Vs]` (shard r holds global columns r*Vs .. r*Vs+Vs-1) and
never concatenates it. Randomness is one counter-based uniform per row, a pure function of
(seed, request id, position), so a token never depends on the mode or on how many calls ran before.

Semantics (exact, so every layout and mode agrees):
- greedy (temperature 0): the largest logit, ties to the lowest vocab index;
- top-k: the k largest by (value desc, index asc); top-p: the shortest such prefix with mass >= p;
- sampling: inverse CDF over the kept tokens in canonical order, probabilities in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MASK64 = (1 << 64) - 1


def _mix64(z: int) -> int:
    """splitmix64 finalizer: a bijective 64-bit mix with good avalanche."""
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB & _MASK64
    return z ^ (z >> 31)


def row_uniform(seed: int, request_id: int, position: int) -> float:
    """A uniform in [0, 1) that depends only on (seed, request, position)."""
    z = _mix64((seed & _MASK64) ^ 0x9E3779B97F4A7C15)
    z = _mix64(z ^ (request_id & _MASK64))
    z = _mix64(z ^ (position & _MASK64))
    return (z >> 11) * (1.0 / (1 << 53))


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means off
    top_p: float = 1.0  # 1.0 means off
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class SamplingRow:
    """What the sampler needs to know about one row of the batch."""

    params: SamplingParams
    request_id: int
    position: int  # index of the token being produced within its request


def sample(shards: torch.Tensor, vocab: int, rows: list[SamplingRow]) -> torch.Tensor:
    """Tokens for every row: int64 [B]. `shards` is [P, B, Vs]; columns >= vocab must already be -inf."""
    num_shards, batch, shard_width = shards.shape
    if batch != len(rows):
        raise ValueError(f"{batch} logit rows but {len(rows)} sampling rows")
    tokens = _greedy(shards)
    groups: dict[SamplingParams, list[int]] = {}
    for i, row in enumerate(rows):
        if not row.params.greedy:
            groups.setdefault(row.params, []).append(i)
    for params, idx in groups.items():
        u = _to_device([row_uniform(params.seed, rows[i].request_id, rows[i].position) for i in idx],
                       torch.float64, shards.device)
        if len(idx) == batch:  # one kind of row: no indexing at all
            tokens = _sample_group(shards, params, u, shard_width)
        else:
            index = _to_device(idx, torch.int64, shards.device)
            tokens[index] = _sample_group(shards.index_select(1, index), params, u, shard_width)
    return tokens


def _to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list on the device without a synchronization: on CUDA through pinned memory, non-blocking (a
    plain copy from pageable memory makes the host wait for the stream)."""
    host = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host if device.type == "cpu" else host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def _greedy(shards: torch.Tensor) -> torch.Tensor:
    values, local = shards.max(dim=2)  # [P, B]: first maximum within each shard
    best_shard = values.argmax(dim=0)  # first maximal shard -> lowest global index on ties
    local_best = local.gather(0, best_shard.unsqueeze(0)).squeeze(0)
    return best_shard * shards.shape[2] + local_best


def _sample_group(shards: torch.Tensor, params: SamplingParams, u: torch.Tensor, width: int) -> torch.Tensor:
    if params.top_k == 0 and params.top_p >= 1.0:
        return _sample_full(shards, params.temperature, u, width)
    x = shards.to(torch.float64)
    row_max = x.amax(dim=(0, 2))  # [B]
    k_total = shards.shape[0] * width
    if params.top_k:
        vals, ids = _top_candidates(x, min(params.top_k, k_total), width)
    else:
        vals, ids = None, None
    probs_of = lambda v: torch.exp((v - row_max[:, None]) / params.temperature)  # noqa: E731
    if params.top_p < 1.0:
        if vals is None:
            total = probs_of(x.permute(1, 0, 2).reshape(x.shape[1], -1)).sum(dim=1)
            k = min(64, k_total)
            while True:
                vals, ids = _top_candidates(x, k, width)
                if k == k_total or bool((probs_of(vals).sum(dim=1) >= params.top_p * total).all()):
                    break
                k = min(2 * k, k_total)
        else:
            total = probs_of(vals).sum(dim=1)
        probs = probs_of(vals)
        cum = probs.cumsum(dim=1)
        # keep the shortest prefix whose mass reaches top_p * total (always at least one token)
        keep = (cum - probs) < params.top_p * total[:, None]
        probs = probs * keep
    else:
        probs = probs_of(vals)
    cum = probs.cumsum(dim=1)
    pick = torch.searchsorted(cum, (u * cum[:, -1]).unsqueeze(1), right=True).clamp_(max=cum.shape[1] - 1)
    return ids.gather(1, pick).squeeze(1)


def _sample_full(shards: torch.Tensor, temperature: float, u: torch.Tensor, width: int) -> torch.Tensor:
    x = shards.to(torch.float64)
    row_max = x.amax(dim=(0, 2))
    e = torch.exp((x - row_max[None, :, None]) / temperature)  # [P, B, Vs]
    shard_mass = e.sum(dim=2).T.contiguous()  # [B, P]
    cum_shard = shard_mass.cumsum(dim=1)
    target = u * cum_shard[:, -1]
    shard = torch.searchsorted(cum_shard, target.unsqueeze(1), right=True).clamp_(max=shards.shape[0] - 1)
    zero = torch.zeros_like(shard, dtype=e.dtype)
    before = torch.where(shard > 0, cum_shard.gather(1, (shard - 1).clamp(min=0)), zero)  # mass of earlier shards
    rows = torch.arange(e.shape[1], device=e.device)
    within = e[shard.squeeze(1), rows, :].cumsum(dim=1)  # [B, Vs]
    local = torch.searchsorted(within, (target.unsqueeze(1) - before), right=True).clamp_(max=width - 1)
    return shard.squeeze(1) * width + local.squeeze(1)


def _top_candidates(x: torch.Tensor, k: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest per row by (value desc, index asc) from `x` [P, B, Vs]: values and global ids [B, k]."""
    num_shards, batch, _ = x.shape
    k_shard = min(k, width)
    shard_vals, local = x.topk(k_shard, dim=2)  # [P, B, ks], each shard sorted descending
    ids = local + (torch.arange(num_shards, device=x.device) * width)[:, None, None]
    vals = shard_vals.permute(1, 0, 2).reshape(batch, -1)
    ids = ids.permute(1, 0, 2).reshape(batch, -1)
    # canonical order: by index, then stably by value descending
    order = ids.argsort(dim=1, stable=True)
    vals, ids = vals.gather(1, order), ids.gather(1, order)
    order = vals.argsort(dim=1, descending=True, stable=True)
    vals, ids = vals.gather(1, order), ids.gather(1, order)
    # topk may have dropped tokens equal to the k-th value that have lower indices than kept ones;
    # rows where the full shard holds more such ties than the candidate list are rebuilt exactly (rare).
    kth = vals[:, k - 1]
    ties_listed = (vals == kth[:, None]).sum(dim=1)
    ties_total = (x == kth[None, :, None]).sum(dim=(0, 2))
    vals, ids = vals[:, :k].clone(), ids[:, :k].clone()
    for b in (ties_total > ties_listed).nonzero().flatten().tolist():
        vals[b], ids[b] = _exact_top_row(x[:, b, :].reshape(-1), k)
    return vals, ids


def _exact_top_row(row: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    order = row.argsort(descending=True, stable=True)[:k]
    return row[order], order
