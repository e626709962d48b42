"""Keeping the random state of ranks that skip sampling in step with rank 0.

Engines that sample on every TP rank (SGLang, vLLM) keep the ranks' sampled tokens identical without any token
exchange: every rank seeds its generator alike and makes the same random draws in the same order, so every
rank draws the same tokens. In gather mode only rank 0 samples; the other ranks skip the sampler, so their
generator stops advancing while rank 0's moves on. That is harmless while they do not sample (they receive
rank 0's tokens), and wrong from the first call on where they sample again from the generator: an all_gather
call whose batch is not all-greedy would draw different tokens on different ranks.

So the state is handed over lazily, exactly when it matters: every rank tracks (identically, from the mode and
batch of each call, which all ranks share) whether some rank skipped a drawing call since the last hand-over,
and right before the next call where every rank draws, rank 0's generator state reaches every rank by one
broadcast. After it every rank holds the state it would have held had it sampled every batch itself, which is
plain-engine behaviour bit for bit. Greedy calls and gather-mode calls cost nothing; a hand-over costs one
small broadcast (16 bytes for a CUDA generator, 5 KB for the CPU one) per return from gather to all_gather.

Requests with a seed of their own draw from a per-request generator instead (vLLM keeps one per seeded request;
every rank builds it alike from the seed). The same rule holds per request: a seeded request that drew in a
call some rank skipped is stale, and right before the next call where every rank draws for it, rank 0's state of
its generator reaches every rank (one broadcast for all the stale requests of that call, in batch order).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterable, Mapping

import torch

from gatherwise.engine_hooks.comm import Communicator


def default_generator(device: torch.device) -> torch.Generator:
    """The generator torch's sampling ops draw from for tensors on `device` when none is passed."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[index]
    return torch.default_generator


log = logging.getLogger("gatherwise.rng")


class RandomStateResync:
    """Call `before_call(all_ranks_sample, draws, request_generators)` on every rank, at every hooked call, before
    any rank samples.

    all_ranks_sample: every rank runs the engine's sampler in this call (all_gather mode);
    False when only rank 0 does (gather mode).
    draws: the batch draws from the default generator (not all-greedy).
    request_generators: {request id: its own generator} of the batch's seeded rows, in batch order (the same on
    every rank).
    """

    def __init__(self, comm: Communicator, device: torch.device | str,
                 generator: torch.Generator | None = None) -> None:
        self.comm = comm
        self.device = torch.device(device)
        self.generator = generator if generator is not None else default_generator(self.device)
        self.stale = False  # some rank skipped a drawing call since the last hand-over (same on every rank)
        self.stale_requests: set[Hashable] = set()  # seeded requests whose draws some rank skipped
        self.handovers = 0
        self.request_handovers = 0  # per-request generator states handed over

    def before_call(self, all_ranks_sample: bool, draws: bool,
                    request_generators: Mapping[Hashable, torch.Generator] | None = None) -> None:
        if self.comm.world_size == 1:
            return
        if not all_ranks_sample:
            self.stale = self.stale or draws
            if request_generators:
                self.stale_requests.update(request_generators)
            return
        if draws and self.stale:
            self.hand_over()
        if request_generators and self.stale_requests:
            due = [(key, gen) for key, gen in request_generators.items() if key in self.stale_requests]
            if due:
                self.hand_over_requests(due)

    def finished(self, requests: Iterable[Hashable]) -> None:
        """Forget these requests: finished requests never draw again."""
        self.stale_requests.difference_update(requests)

    def hand_over(self) -> None:
        """Every rank adopts rank 0's generator state (a collective: every rank must call it)."""
        self._adopt([self.generator])
        self.stale = False
        self.handovers += 1
        if self.comm.rank != 0:
            log.info("gatherwise: TP rank %d adopted rank 0's generator state (hand-over %d)", self.comm.rank,
                     self.handovers)

    def hand_over_requests(self, due: list[tuple[Hashable, torch.Generator]]) -> None:
        """Every rank adopts rank 0's state of these per-request generators (one collective for all of them)."""
        self._adopt([gen for _, gen in due])
        self.stale_requests.difference_update(key for key, _ in due)
        self.request_handovers += len(due)

    def _adopt(self, generators: list[torch.Generator]) -> None:
        states = [g.get_state() for g in generators]  # CPU uint8 tensors; the same lengths on every rank
        buf = torch.cat(states).to(self.device)
        self.comm.broadcast(buf)
        if self.comm.rank != 0:
            host = buf.cpu()
            offset = 0
            for gen, state in zip(generators, states, strict=True):
                gen.set_state(host[offset: offset + state.numel()].clone())
                offset += state.numel()
