"""SGLang's keyed (deterministic) sampling on vocab shards, giving SGLang's token bit for bit.

What SGLang 0.5.23 computes (`Sampler.forward`, standard path, `--enable-deterministic-inference`, every row of
the batch with a `sampling_seed`, no top-k / top-p / min-p in the batch, no RL on-policy target):

    x  = logits.div_(temperatures)          # in the logits' dtype (bf16 stays bf16), temperatures float32 [B, 1]
    p  = torch.softmax(x, dim=-1)            # over the FULL row, in x's dtype
    lp = torch.log(p)                        # in x's dtype: log of the probabilities, not log_softmax
    token = multinomial_with_seed(lp, seed, positions):
        u = murmur_hash32(seed, position, column) / (2**32 - 1)            # float64
        g = -log(-clamp(log u, min=float64 min, max=-2**-32))                 # float64 Gumbel noise
        argmax over columns of (g + lp.double())                            # first index on exact ties

The noise g of a column depends only on (seed, position, global column id), so a rank can compute it for its own
shard. The softmax is the catch: p_j = e_j / S with S the sum over the whole row, rounded by SGLang's kernel in
an order no shard can reproduce (on this CPU build of torch the softmax's internal exp is not even torch.exp's:
`torch.exp(x - max) / S` matches `torch.softmax` for no float32 S). Mathematically the normaliser subtracts the
same log S from every column and cannot change the argmax; in floating point every column is rounded on its own
(exp, division, rounding p to x's dtype, the log and its rounding), so two columns whose values g + lp are
within a few roundings of each other can be reordered by the exact S. A winner taken per shard with any
normaliser other than SGLang's own is therefore NOT exact: `tests/sglang/test_keyed_gumbel.py` builds such rows
(float32 logits scanned ulp by ulp across a near-tie between two shards) where it differs from SGLang.

What is exact here: an interval argument, then the full row only where the interval cannot decide.

    lp_j(SGLang) = (x_j - lse) + c + d_j,     |d_j| <= E(x_j - lse) = abs_tol + rel_tol * |x_j - lse|

with lse the exact log-normaliser, c one constant per row (SGLang's rounded S against the exact one; it cancels in
the argmax; on CPU it reaches 1.5e-5 for float32 rows, an accumulated sum's error) and d_j the per-column
rounding, bounded per dtype (`BOUNDS`). The bounds follow from the roundings (the probability rounded to the dtype:
2^-9 relative for bfloat16; the log rounded to the dtype: half an ulp, at most 2^-8 |l| for bfloat16; float32's
own exp, division and log a few 2^-24) with a margin of about 2: on CPU, over 48 rows of every scale from flat to
peaked, the best c leaves every |d_j| within 0.49 of the bfloat16 bound, 0.22 of float16's and 0.007 of float32's
(`test_rounding_bounds_hold_with_a_margin_of_two`); a GPU's softmax and log (CUDA expf / logf, a few ulps) fall
inside too. With A_j = x_j + g_j:

    V_j(SGLang) - c' in [A_j - E_j, A_j + E_j]          (c' common to the row)

Let L = the largest lower end A_j - E_j over the whole row. A column whose upper end A_k + E_k < L can never be
SGLang's argmax (the column that reaches L beats it). If exactly one column of the row has its upper end >= L,
that column is SGLang's token, whatever S SGLang's kernel computed. That needs, per rank and row, four float64
numbers: its largest lower end, its two largest upper ends and the column of the first — plus, one exchange
before, its max and mass (m_r, s_r) so every rank computes the same lse (only used for the bound and the floor).
A row where two or more columns reach L is a near tie at the scale of the rounding: its full rows are
all-gathered (those rows only) and sampled by the caller's exact full-row sampler (in an engine: SGLang's own
functions; `sample_full_rows` here replays SGLang's ops in eager torch), so the token is SGLang's on every row.
Columns whose probability could be subnormal or zero in x's dtype (x_j - lse below `BOUNDS[...].floor`) get no
lower end (SGLang's lp may be -inf) and the floor's upper end, so they can never be certified yet never wrongly
excluded. Padding columns past `vocab_size` (SGLang cuts its logits to the vocab before sampling) take no part.

The noise is recomputed in float64 with SGLang's op sequence; its last-ulp differences against SGLang's compiled
kernel (~1e-16 relative) are inside `NOISE_TOL`. The hash (`murmur_hash32`) is SGLang's integer function, bit for
bit, in int64 torch ops (no sglang import here).

What steps aside (the caller keeps SGLang's own path, e.g. the all_gather mode): any batch in which some row has
top-k, top-p or min-p (SGLang then sorts the whole row and hashes the SORTED position, not the vocab id, for every
row of the batch — greedy rows of a mixed batch count, as SGLang turns them into top_k=1), batches without
per-row seeds, the RL on-policy path (bf16 log_softmax), custom logit processors, and the ascend backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from gatherwise.engine_hooks.comm import Communicator

F64 = torch.float64
MASK32 = 0xFFFFFFFF
UINT32_MAX = float(2**32 - 1)
NOISE_TOL = 2.0**-40  # relative, on |g|: the eager noise against SGLang's compiled (inductor / triton) noise
_NEG_INF = float("-inf")
_C1, _C2, _M, _N = 0xCC9E2D51, 0x1B873593, 5, 0xE6546B64
_F1, _F2 = 0x85EBCA6B, 0xC2B2AE35

FullRowSampler = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""(temperature-scaled full rows [A, vocab] in the logits' dtype, seeds [A], positions [A]) -> tokens [A]."""


@dataclass(frozen=True)
class LogprobBound:
    """|SGLang's log p_j - (x_j - lse) - c| <= abs_tol + rel_tol * |x_j - lse| while x_j - lse >= floor."""

    abs_tol: float
    rel_tol: float
    floor: float  # below it p_j may be subnormal or zero in this dtype

    def at(self, log_p: torch.Tensor) -> torch.Tensor:
        return self.abs_tol + self.rel_tol * log_p.abs()


BOUNDS = {
    torch.float32: LogprobBound(abs_tol=2.0**-16, rel_tol=2.0**-16, floor=-80.0),  # normal min e^-87.3
    torch.bfloat16: LogprobBound(abs_tol=2.0**-7, rel_tol=2.0**-7, floor=-80.0),  # float32's exponent range
    torch.float16: LogprobBound(abs_tol=2.0**-9, rel_tol=2.0**-9, floor=-9.0),  # normal min e^-9.7
}


def _mul32(a: torch.Tensor, c: int) -> torch.Tensor:
    """(a * c) mod 2^32 for a in [0, 2^32): split in 16-bit halves so no int64 product overflows."""
    high = a * (c >> 16)
    high.bitwise_and_(0xFFFF).bitwise_left_shift_(16).add_(a * (c & 0xFFFF))
    return high.bitwise_and_(MASK32)


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return (x >> (32 - r)).bitwise_or_((x << r).bitwise_and_(MASK32))


def _mix(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    k = _rotl32(_mul32(k, _C1), 15)
    h = _rotl32(h ^ _mul32(k, _C2), 13)
    return h.mul_(_M).add_(_N).bitwise_and_(MASK32)


def murmur_hash32(seeds: torch.Tensor, positions: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """SGLang's murmur_hash32(seed, position, column) as int64 values in [0, 2^32): [len(seeds), len(columns)].

    The seed is taken as its 64 two's-complement bits (SGLang casts it to uint64), low word then high word; the
    position and the column as their low 32 bits (SGLang's kernel casts them to uint32)."""
    seeds, positions, columns = (t.to(torch.int64) for t in (seeds, positions, columns))
    h = torch.zeros_like(seeds)
    h = _mix(h, seeds & MASK32)
    h = _mix(h, (seeds >> 32) & MASK32)
    h = _mix(h, positions & MASK32)
    h = _mix(h.unsqueeze(1), (columns & MASK32).unsqueeze(0))
    h.bitwise_xor_(16)
    h.bitwise_xor_(h >> 16)
    h = _mul32(h, _F1)
    h.bitwise_xor_(h >> 13)
    h = _mul32(h, _F2)
    return h.bitwise_xor_(h >> 16)


def keyed_noise(seeds: torch.Tensor, positions: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """SGLang's float64 Gumbel noise of each (row, column), by its own op sequence."""
    x = murmur_hash32(seeds, positions, columns).to(F64) / UINT32_MAX
    x.log_().clamp_(min=torch.finfo(F64).min, max=-(2.0**-32)).neg_()
    x.log_().neg_()
    return x


def scale_by_temperature(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """SGLang's `logits.div_(temperatures)` on a copy: elementwise, so a shard's values are the full row's."""
    return logits.clone().div_(temperatures.reshape(-1, 1))


def _real_columns(width: int, offset: int, vocab_size: int, device: torch.device) -> torch.Tensor:
    return torch.arange(offset, offset + width, device=device)[: max(0, min(width, vocab_size - offset))]


def shard_mass(x: torch.Tensor, n_real: int) -> torch.Tensor:
    """[B, 2] float64: the shard's max m_r and mass sum exp(x - m_r) over its real columns (m_r = -inf if none)."""
    v = x[:, :n_real].to(F64)
    out = torch.full((x.shape[0], 2), _NEG_INF, dtype=F64, device=x.device)
    out[:, 1] = 0.0
    if n_real:
        m = v.max(dim=1).values
        out[:, 0] = m
        out[:, 1] = torch.exp(v - m.unsqueeze(1)).sum(dim=1)
    return out


def log_normaliser(masses: torch.Tensor) -> torch.Tensor:
    """[B] float64 lse from the gathered [R, B, 2] (m_r, s_r): the same numbers, the same ops, on every rank."""
    m = masses[:, :, 0].max(dim=0).values
    s = (masses[:, :, 1] * torch.exp(masses[:, :, 0] - m.unsqueeze(0))).sum(dim=0)
    return m + torch.log(s)


def shard_bounds(x: torch.Tensor, noise: torch.Tensor, lse: torch.Tensor, offset: int) -> torch.Tensor:
    """[B, 4] float64 per row of this shard: largest lower end, largest upper end, its global column, second
    largest upper end (-inf where the shard has fewer real columns). `x` and `noise` cover real columns only."""
    bound = BOUNDS[x.dtype]
    b = x.shape[0]
    out = torch.full((b, 4), _NEG_INF, dtype=F64, device=x.device)
    if x.shape[1] == 0:
        out[:, 2] = -1.0
        return out
    v = x.to(F64)
    log_p = v - lse.unsqueeze(1)
    floor_x = lse.unsqueeze(1) + bound.floor
    tol = NOISE_TOL * (1.0 + noise.abs())
    normal = log_p >= bound.floor
    lower = torch.where(normal, v + noise - bound.at(log_p) - tol, _NEG_INF)
    upper = torch.maximum(v, floor_x) + noise + bound.at(log_p.clamp(min=bound.floor)) + tol
    out[:, 0] = lower.max(dim=1).values
    top = torch.topk(upper, k=min(2, upper.shape[1]), dim=1)
    out[:, 1] = top.values[:, 0]
    out[:, 2] = (top.indices[:, 0] + offset).to(F64)
    if upper.shape[1] > 1:
        out[:, 3] = top.values[:, 1]
    return out


def combine_bounds(bounds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """From the gathered [R, B, 4]: (tokens [B] int64, decided [B] bool). A row is decided when exactly one column
    of the whole row has its upper end at or above the row's largest lower end; its token is that column."""
    level = bounds[:, :, 0].max(dim=0).values
    reach1 = bounds[:, :, 1] >= level
    reach2 = bounds[:, :, 3] >= level
    decided = (reach1.sum(dim=0) + reach2.sum(dim=0)) == 1
    winner_rank = reach1.to(torch.int64).argmax(dim=0)
    tokens = bounds[:, :, 2].gather(0, winner_rank.unsqueeze(0)).squeeze(0).to(torch.int64)
    return torch.where(decided, tokens, torch.full_like(tokens, -1)), decided


def sample_full_rows(x: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """SGLang's ops on whole temperature-scaled rows, in eager torch: softmax and log in x's dtype, the float64
    noise added, argmax. An engine passes SGLang's own functions instead (the noise's compiled last ulp)."""
    lp = torch.log(torch.softmax(x, dim=-1))
    noise = keyed_noise(seeds, positions, torch.arange(x.shape[1], device=x.device))
    return torch.argmax(noise.add_(lp.to(F64)), dim=1)


def sglang_full_row_sampler() -> FullRowSampler:
    """SGLang's own functions for whole rows (imported when called: only an SGLang engine has them): its softmax
    and `sampling_from_probs_torch`, which runs its compiled `multinomial_with_seed`."""
    from sglang.srt.layers.sampler import sampling_from_probs_torch

    def sample(x: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return sampling_from_probs_torch(torch.softmax(x, dim=-1), seeds, positions)

    return sample


@dataclass(frozen=True)
class KeyedResult:
    tokens: torch.Tensor  # [B] int64, the same on every rank
    full_rows: int  # rows whose full logits were gathered (near ties at the rounding's scale)


def sample_keyed_sharded(comm: Communicator, logits: torch.Tensor, *, vocab_size: int,
                         temperatures: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
                         full_row_sampler: FullRowSampler = sample_full_rows) -> KeyedResult:
    """SGLang's keyed token for every row, from this rank's logits shard [B, W] (global columns rank*W ...).

    Every rank calls this with its own shard and the same per-row temperatures, seeds and positions. Two small
    all_gathers (2 and 4 float64 per row), plus one of the undecided rows' shards when there are any."""
    if logits.dtype not in BOUNDS:
        raise TypeError(f"keyed sharded sampling supports {sorted(map(str, BOUNDS))} logits, got {logits.dtype}")
    b, width = logits.shape
    for name, t in (("temperatures", temperatures), ("seeds", seeds), ("positions", positions)):
        if t.numel() != b:
            raise ValueError(f"{name} has {t.numel()} entries for {b} rows")
    if comm.world_size * width < vocab_size:
        raise ValueError(f"{comm.world_size} shards of {width} columns cannot hold a vocab of {vocab_size}")
    offset = comm.rank * width
    x = scale_by_temperature(logits, temperatures)
    columns = _real_columns(width, offset, vocab_size, logits.device)
    n_real = columns.numel()
    masses = torch.empty((comm.world_size, b, 2), dtype=F64, device=logits.device)
    comm.all_gather(masses, shard_mass(x, n_real))
    lse = log_normaliser(masses)
    noise = keyed_noise(seeds, positions, columns)
    bounds = torch.empty((comm.world_size, b, 4), dtype=F64, device=logits.device)
    comm.all_gather(bounds, shard_bounds(x[:, :n_real], noise, lse, offset))
    tokens, decided = combine_bounds(bounds)
    undecided = (~decided).nonzero().flatten()
    if undecided.numel():
        rows = torch.empty((comm.world_size, undecided.numel(), width), dtype=x.dtype, device=x.device)
        comm.all_gather(rows, x.index_select(0, undecided).contiguous())
        full = rows.permute(1, 0, 2).reshape(undecided.numel(), comm.world_size * width)[:, :vocab_size]
        tokens[undecided] = full_row_sampler(full.contiguous(), seeds[undecided], positions[undecided]).to(
            torch.int64)
    return KeyedResult(tokens=tokens, full_rows=int(undecided.numel()))
