"""What the vLLM patches do inside one worker (one TP rank): the logits collective of a step, and its sampling.

A step's logits call is the `compute_logits` inside `GPUModelRunner.execute_model` (CPUModelRunner inherits
it); vLLM's sampler consumes it in the following `sample_tokens`. Only that call goes through gatherwise:
other logits calls (warm-up sampler run, prompt logprobs) keep vLLM's own all_gather, so the sequence of
hooked calls is the same on every rank and each one is followed by exactly one sampler call.

- all_gather mode: the hooked collective returns the full logits to vLLM as usual; every rank samples with
  vLLM's sampler, as vLLM does without the plugin.
- gather mode: rank 0 gets the full logits and samples with vLLM's sampler; the other ranks get placeholder
  logits, skip the sampler and receive rank 0's token ids (plus the control word) by one broadcast, then go on
  as if they had sampled.
- sharded mode: every rank reduces its own shard to (max, index) per row and one all_gather of those pairs
  gives every rank the argmax (engine_hooks.sharded_exchange); all ranks get placeholder logits, skip vLLM's
  sampler and return those tokens. Only for batches whose greedy token is the argmax of the raw logits
  (`sharded_greedy_ok`: no penalties, logit bias, min-tokens, bad words, allowed-token masks, logprobs);
  other all-greedy batches in a sharded bucket run all_gather.
- vLLM keeps its TP ranks in step by giving every rank the same random stream. A rank that skips a random
  sample would fall out of that stream, so a batch that is not all-greedy always runs all_gather (recorded as
  such); gather and sharded modes apply to all-greedy batches.

The hooks are installed lazily at the first hooked call (torch.distributed and vLLM's TP group exist by then):
handshake, engine id, ring recorder and control block come from engine_hooks.install.install_hooks.
"""

from __future__ import annotations

import logging
import multiprocessing.util
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from engine_hooks.adapters.rank_hooks import RankHooks, shard_shape_problem
from gatherwise.config import GatherwiseConfig
from gatherwise.modes import Mode

log = logging.getLogger("gatherwise.vllm")
_FINALIZE_PRIORITY = 10  # multiprocessing runs finalizers that have an exit priority when a worker exits, highest first


class VllmStepHooks(RankHooks):
    def __init__(self, config: GatherwiseConfig) -> None:
        super().__init__(config, log)
        self._runner: Any = None  # the model runner inside execute_model, else None
        self._pending: Mode | None = None  # mode of the hooked call whose sampling is still to come

    # -- scope: the step's logits call --------------------------------------------------------------------
    @contextmanager
    def step(self, runner: Any) -> Iterator[None]:
        self._runner = runner
        try:
            yield
        finally:
            self._runner = None

    def _disable(self, reason: str) -> None:
        self.disabled = reason
        log.warning("gatherwise: hooks stay off in this vLLM worker: %s; vLLM's own logits path runs", reason)

    def _path(self, runner: Any, logits: torch.Tensor):
        if self.installed is not None:
            return self.installed.path
        if self.disabled is not None:
            return None
        # Every rank reaches the same decision here from the same config, so no rank waits alone.
        if getattr(runner, "speculative_config", None) is not None:
            self._disable("speculative decoding is not supported")
            return None
        from vllm.distributed.parallel_state import get_pp_group, get_tp_group

        if get_pp_group().world_size > 1:
            self._disable("pipeline parallelism is not supported")
            return None
        problem = shard_shape_problem(logits)
        if problem:
            self._disable(problem)
            return None
        from engine_hooks.adapters.vllm_comm import VllmGroupCommunicator

        path = self._install(VllmGroupCommunicator(get_tp_group()), logits)
        # a forked vLLM worker ends through multiprocessing, which skips atexit but runs its finalizers
        multiprocessing.util.Finalize(None, self.close, exitpriority=_FINALIZE_PRIORITY)
        return path

    # -- LogitsProcessor._gather_logits ---------------------------------------------------------------------
    def gather_logits(self, processor: Any, logits: torch.Tensor, original: Callable) -> torch.Tensor:
        runner = self._runner
        path = self._path(runner, logits) if runner is not None else None
        if path is None:
            return original(processor, logits)
        rows = logits.shape[0]
        buf = path.logits_buffer(rows)
        buf.copy_(logits)  # the one copy vLLM's own all_gather does not make
        metadata = runner.input_batch.sampling_metadata
        all_greedy = metadata.all_greedy
        # Every rank decides from the same table and the same (broadcast) sampling metadata. begin_call adopts
        # what is due for this call and returns its mode; exchange()/run() below do not repeat it.
        if all_greedy and path.begin_call(rows) == Mode.SHARDED:
            if sharded_greedy_ok(metadata):
                self._pending = Mode.SHARDED
                # vLLM pads the LM head; its padding is trimmed after the gather
                return self._sharded_argmax(path, buf, getattr(processor, "org_vocab_size", None), logits)
            all_greedy = False  # the greedy token is not the raw argmax here: all_gather, as vLLM does
        mode, shards = path.exchange(mode=None if all_greedy else Mode.ALL_GATHER)
        self._pending = mode
        return self._engine_logits(path, mode, shards, logits)

    # -- Sampler.forward ------------------------------------------------------------------------------------
    def sample(self, sampler: Any, original: Callable, logits: torch.Tensor, *args: Any, **kwargs: Any):
        mode, self._pending = self._pending, None
        if mode is None:
            return original(sampler, logits, *args, **kwargs)
        path = self.installed.path
        if mode == Mode.SHARDED:
            tokens, self._sharded_tokens = self._sharded_tokens, None
            from vllm.v1.outputs import SamplerOutput

            return SamplerOutput(sampled_token_ids=tokens.to(torch.int32).unsqueeze(-1), logprobs_tensors=None)
        clock = getattr(path, "clock", time.perf_counter_ns)
        if mode == Mode.ALL_GATHER or path.rank == 0:
            start = clock()
            out = original(sampler, logits, *args, **kwargs)
            end = clock()
            tokens = out.sampled_token_ids.view(-1) if mode != Mode.ALL_GATHER else None
            path.complete(tokens, sample_start=start, sample_end=end)
            return out
        tokens = path.complete(None)
        from vllm.v1.outputs import SamplerOutput

        return SamplerOutput(sampled_token_ids=tokens.to(torch.int32).unsqueeze(-1), logprobs_tensors=None)


def sharded_greedy_ok(metadata: Any) -> bool:
    """Whether vLLM's greedy token for every row is the argmax of the raw logits, so sharded mode may pick it
    from the shards: nothing that rewrites logits before the argmax, and no logprobs (they need every column).
    Unknown logits processors that may move the argmax make it False."""
    if not metadata.all_greedy or not metadata.no_penalties or metadata.allowed_token_ids_mask is not None:
        return False
    if metadata.bad_words_token_ids or metadata.max_num_logprobs is not None:
        return False
    if getattr(metadata, "logprob_token_ids", None) or any(getattr(metadata, "spec_token_ids", None) or ()):
        return False  # spec_token_ids is one (normally empty) list per request slot
    holder = getattr(metadata, "thinking_budget_state_holder", None)
    if holder is not None and holder.has_tracked_requests():
        return False
    for proc in getattr(metadata.logitsprocs, "non_argmax_invariant", ()):
        # vLLM's built-ins are idle when their per-request state is empty (logit_bias, min_tokens)
        state = getattr(proc, "biases", getattr(proc, "min_toks", None))
        if state is None or state:
            return False
    return True
