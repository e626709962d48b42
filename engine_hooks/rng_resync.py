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
"""

from __future__ import annotations

import logging

import torch

from engine_hooks.comm import Communicator


def default_generator(device: torch.device) -> torch.Generator:
    """The generator torch's sampling ops draw from for tensors on `device` when none is passed."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[index]
    return torch.default_generator


log = logging.getLogger("gatherwise.rng")


class RandomStateResync:
    """Call `before_call(all_ranks_sample, draws)` on every rank, at every hooked call, before any rank samples.

    all_ranks_sample: every rank runs the engine's sampler in this call (all_gather mode);
    False when only rank 0 does (gather mode).
    draws: the batch draws from the default generator (not all-greedy, not seeded per request).
    """

    def __init__(self, comm: Communicator, device: torch.device | str,
                 generator: torch.Generator | None = None) -> None:
        self.comm = comm
        self.device = torch.device(device)
        self.generator = generator if generator is not None else default_generator(self.device)
        self.stale = False  # some rank skipped a drawing call since the last hand-over (same on every rank)
        self.handovers = 0

    def before_call(self, all_ranks_sample: bool, draws: bool) -> None:
        if not draws:
            return
        if not all_ranks_sample:
            self.stale = self.stale or self.comm.world_size > 1
        elif self.stale:
            self.hand_over()

    def hand_over(self) -> None:
        """Every rank adopts rank 0's generator state (a collective: every rank must call it)."""
        state = self.generator.get_state()  # a CPU uint8 tensor; the same length on every rank
        buf = state.to(self.device)
        self.comm.broadcast(buf)
        if self.comm.rank != 0:
            self.generator.set_state(buf.cpu())
        self.stale = False
        self.handovers += 1
        if self.comm.rank != 0:
            log.info("gatherwise: TP rank %d adopted rank 0's generator state (hand-over %d)", self.comm.rank,
                     self.handovers)
