"""Sharded mode: every rank samples from its own vocab shard; only what sampling needs crosses the wire.

A call runs one or two all_gathers, fixed by the sampling kinds of its rows (gatherwise.engine_hooks.shard_sampling):

1. `shard_exchange` (always): each rank's per-row summaries as float64 — greedy: (max, index), O(B); top-k:
   its k best (value, index), O(B·k); temperature: (shard max, shard mass), O(B); top-p, min-p: max, mass, its
   best `top_p_candidates(width)`. Rank 0's control word rides in word 0 of its chunk. After it every rank holds the
   same P summaries and computes the same tokens for greedy, top-k and covered top-p rows, and the same
   (shard, target) for temperature rows.
2. `shard_resolve` (only when the call has temperature, top-p or min-p rows): each rank sends the tokens of the
   temperature rows whose drawn position lies in its shard (−1 for the others, found by
   `find_in_shard`), and the full shard rows of the top-p / min-p rows whose kept tokens the candidates do not
   cover — which every rank decides identically from the exchanged summaries. After it every rank picks each
   temperature row's token from its owner's slot and samples the fallback rows from the full rows.

Every rank ends the call holding all tokens; there is no broadcast. The number of collectives depends only on
the kinds of the rows (the same on every rank), never on the data: a call with top-p rows runs
`shard_resolve` even when no row falls back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gatherwise.engine_hooks.comm import Communicator
from gatherwise.engine_hooks.sampling_params import SamplingRow
from gatherwise.engine_hooks.shard_sampling import (
    F64,
    Group,
    Kind,
    MassDraw,
    combine_greedy,
    combine_top_k,
    draw_candidates,
    draw_shard,
    find_in_shard,
    plan,
    sample_top_p_rows,
    select_rows,
    summarize,
    token_slots,
    top_p_covered,
)

_WORD_BYTES = 8


@dataclass
class ShardedCall:
    """The outcome of one sharded call on this rank: tokens, the received control word, marks and counts."""

    tokens: torch.Tensor  # int64 [B], the same on every rank
    word_in: torch.Tensor  # int64 [1]: rank 0's control word as every rank received it
    coll_start: int
    coll_end: int
    resolve_start: int  # 0 when the call ran only shard_exchange
    resolve_end: int
    sample_start: int
    # sample_start + this rank's compute time (summaries, combine, owner search, fallback); with an event clock
    # (CUDA), whose marks are tokens resolved later and cannot be summed, the mark ending the shard summaries
    sample_end: int
    exchange_bytes: int
    resolve_bytes: int
    collectives: int
    topp_rows: int
    fallback_rows: int


def collectives_for(rows: list[SamplingRow], width: int) -> int:
    """How many collectives a sharded call with these rows runs: 1, or 2 with temperature or top-p rows."""
    return 2 if any(g.kind in (Kind.FULL, Kind.TOP_P) for g in plan(rows, width)) else 1


class ShardedSampler:
    """One rank's side of sharded mode over a Communicator (all_gather only)."""

    def __init__(self, comm: Communicator, width: int, *, dtype: torch.dtype, device: torch.device,
                 clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.comm, self.width, self.dtype, self.device, self.clock = comm, width, dtype, device, clock
        self.rank, self.world_size = comm.rank, comm.world_size
        self._elem_size = torch.empty((), dtype=dtype).element_size()

    def run(self, logits: torch.Tensor, rows: list[SamplingRow], word: int | torch.Tensor) -> ShardedCall:
        """`logits` is this rank's [B, width] shard (padding columns already -inf); `word` the control word this
        rank puts in its chunk (only rank 0's is read)."""
        clock, width, num_shards, device = self.clock, self.width, self.world_size, self.device
        t0 = clock()
        groups = plan(rows, width)
        uniforms = [g.uniforms(rows, device) if g.kind != Kind.GREEDY else None for g in groups]
        # -- step 1: this shard's summaries, packed after the control word
        sizes = [len(g.rows) * g.per_row for g in groups]
        send = torch.empty(1 + sum(sizes), dtype=F64, device=device)
        if isinstance(word, torch.Tensor):
            send[:1].view(torch.int64).copy_(word)
        else:
            send[:1].view(torch.int64).fill_(word)
        cums: list[torch.Tensor | None] = []
        offset = 1
        for g, size in zip(groups, sizes, strict=True):
            summary, cum = summarize(g, select_rows(logits, g.rows), self.rank, width)
            send[offset:offset + size] = summary.reshape(-1)
            cums.append(cum)
            offset += size
        recv = torch.empty(num_shards, send.numel(), dtype=F64, device=device)
        coll_start = clock()
        self.comm.all_gather(recv, send)
        coll_end = clock()
        # -- step 2: the same combine on every rank
        tokens = torch.empty(len(rows), dtype=torch.int64, device=device)
        owned: list[tuple[Group, torch.Tensor]] = []  # temperature groups: (group, drawn shard per row)
        mine: list[torch.Tensor] = []  # their tokens where this rank owns the drawn position, else -1
        fallback: list[tuple[Group, torch.Tensor, torch.Tensor, MassDraw]] = []  # (group, rows, u, draw)
        topp_rows = fallback_rows = 0
        offset = 1
        for g, size, u, cum in zip(groups, sizes, uniforms, cums, strict=True):
            summaries = recv[:, offset:offset + size].view(num_shards, len(g.rows), g.per_row)
            offset += size
            index = token_slots(g, len(rows), device) if g.kind != Kind.FULL else None  # FULL: after resolve
            if g.kind == Kind.GREEDY:
                tokens[index] = combine_greedy(summaries)
            elif g.kind == Kind.TOP_K:
                assert u is not None  # only greedy groups have no uniforms
                tokens[index] = combine_top_k(g, summaries, u)
            else:
                assert u is not None  # only greedy groups have no uniforms
                draw = draw_shard(summaries[:, :, 0], summaries[:, :, 1], g.params.temperature, u)
                if g.kind == Kind.FULL:
                    # every row searched, the owned ones kept: no host decision (searches are per row)
                    assert cum is not None  # summarize gives temperature rows their cumulative masses
                    found = torch.where(draw.shard == self.rank, find_in_shard(cum, draw.target) + self.rank * width,
                                        -1)
                    owned.append((g, draw.shard))
                    mine.append(found)
                    continue
                assert isinstance(index, torch.Tensor)  # token_slots: top-p rows always get an index
                vals, ids, covered = top_p_covered(g, summaries, draw, width)
                topp_rows += len(g.rows)
                if bool(covered.any()):
                    tokens[index[covered]] = draw_candidates(vals[covered], ids[covered], g.params, u[covered],
                                                             draw.top[covered], draw.total[covered])
                missing = (~covered).nonzero().flatten()
                if missing.numel():
                    fallback.append((g, index[missing], u[missing], draw.select(missing)))
                    fallback_rows += missing.numel()
        # an event clock's marks are tokens, not times: no arithmetic on them (see ShardedCall.sample_end)
        marks_only = getattr(clock, "marks_are_tokens", False)
        sample_ns = 0 if marks_only else (coll_start - t0) + (clock() - coll_end)
        resolve_start = resolve_end = resolve_bytes = 0
        collectives = 1
        if owned or topp_rows:
            t1 = clock()
            resolve, resolve_start, resolve_end = self._resolve(logits, mine, [rows_ for _, rows_, _, _ in fallback])
            collectives = 2
            resolve_bytes = resolve.numel()
            n_owned = sum(m.numel() for m in mine)
            got = resolve[:, _WORD_BYTES:_WORD_BYTES + 8 * n_owned].view(torch.int64)  # [P, owned rows]
            at = 0
            for g, shard in owned:
                n = len(g.rows)
                tokens[token_slots(g, len(rows), device)] = got[:, at:at + n].gather(0, shard[None, :]).squeeze(0)
                at += n
            full = resolve[:, _WORD_BYTES + 8 * n_owned:].view(self.dtype)  # [P, fallback rows * width]
            at = 0
            for g, index, u, draw in fallback:
                n = index.numel()
                x = full[:, at * width:(at + n) * width].reshape(num_shards, n, width)
                tokens[index] = sample_top_p_rows(g, x, draw, u, width)
                at += n
            if not marks_only:
                sample_ns += (resolve_start - t1) + (clock() - resolve_end)
        sample_end = coll_start if marks_only else t0 + sample_ns
        return ShardedCall(tokens, recv[0, :1].view(torch.int64), coll_start, coll_end, resolve_start, resolve_end,
                           t0, sample_end, recv.numel() * 8, resolve_bytes, collectives, topp_rows, fallback_rows)

    def exchange_winners(self, values: torch.Tensor, ids: torch.Tensor, word: int | torch.Tensor, *,
                         sample_start: int, sample_end: int) -> ShardedCall:
        """A sharded call whose rows this rank has already decided on its shard (an engine's own keyed sampler
        run on it): `values` [B] and global `ids` [B] of the shard's winners. One all_gather of the (value, id)
        pairs, then every rank takes the largest value, the lowest id on ties (the full row's first argmax:
        shards hold increasing ids)."""
        n = values.numel()
        send = torch.empty(1 + 2 * n, dtype=F64, device=self.device)
        if isinstance(word, torch.Tensor):
            send[:1].view(torch.int64).copy_(word)
        else:
            send[:1].view(torch.int64).fill_(word)
        pairs = send[1:].view(n, 2)
        pairs[:, 0] = values
        pairs[:, 1] = ids
        recv = torch.empty(self.world_size, send.numel(), dtype=F64, device=self.device)
        coll_start = self.clock()
        self.comm.all_gather(recv, send)
        coll_end = self.clock()
        tokens = combine_greedy(recv[:, 1:].view(self.world_size, n, 2))
        return ShardedCall(tokens, recv[0, :1].view(torch.int64), coll_start, coll_end, 0, 0, sample_start,
                           sample_end, recv.numel() * 8, 0, 1, 0, 0)

    def _resolve(self, logits: torch.Tensor, mine: list[torch.Tensor], fallback_rows: list[torch.Tensor]
                 ) -> tuple[torch.Tensor, int, int]:
        """The second all_gather, as bytes: a count word, the owned temperature tokens, the fallback rows."""
        n_owned = sum(m.numel() for m in mine)
        n_full = sum(r.numel() for r in fallback_rows)
        row_bytes = self.width * self._elem_size
        send = torch.empty(_WORD_BYTES + 8 * n_owned + n_full * row_bytes, dtype=torch.uint8, device=self.device)
        send[:_WORD_BYTES].view(torch.int64).fill_(n_full)
        if n_owned:
            send[_WORD_BYTES:_WORD_BYTES + 8 * n_owned].view(torch.int64).copy_(torch.cat(mine))
        if n_full:
            rows = logits.index_select(0, torch.cat(fallback_rows))
            send[_WORD_BYTES + 8 * n_owned:].view(self.dtype).copy_(rows.reshape(-1))
        recv = torch.empty(self.world_size, send.numel(), dtype=torch.uint8, device=self.device)
        start = self.clock()
        self.comm.all_gather(recv, send)
        end = self.clock()
        counts = recv[:, :_WORD_BYTES].reshape(self.world_size, _WORD_BYTES).view(torch.int64)
        # cannot happen: every rank decided from the same summaries. Checked only when rows fell back: the host
        # has already read the coverage decision then, so the check costs no extra synchronization
        if n_full and bool((counts != n_full).any()):
            raise RuntimeError(f"sharded sampling: ranks disagree on the top-p fallback rows ({counts.tolist()})")
        return recv, start, end
