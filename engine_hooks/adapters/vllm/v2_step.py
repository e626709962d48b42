"""What the vLLM patches do inside one worker running Model Runner V2 (`vllm.v1.worker.gpu`, vLLM's default on
GPUs; its CPU runner subclasses it): the step's logits collective and its sampling.

A V2 step's logits call is the `compute_logits` inside `GPUModelRunner.sample`, which then applies the grammar
bitmask and calls V2's `Sampler`; its tokens must be on every rank when `sample` returns (the runner's
`postprocess_sampled` writes them into every rank's request state). The hooks take `GPUModelRunner.sample` as
the step's scope and `Sampler.sample` (the sampling after V2's `Sampler.__call__` set up the batch, before it
counts the sampled tokens and takes logprobs) as the place to finish the call:

- all_gather: V2 runs as without gatherwise, on every rank.
- gather: rank 0 gets the full logits and runs V2's sampler; the others get placeholder logits, skip
  `Sampler.sample` and receive rank 0's tokens (and the control word) by one broadcast. V2 draws no random
  generator (its noise is keyed), so nothing else has to be carried to the other ranks.
- sharded: greedy batches that nothing rewrites take the argmax of the raw shards, as under V1; every other
  batch whose sampling acts on each column by itself (temperature, the native logits processors; see
  gatherwise.engine_hooks.adapters.vllm.v2_batch) is sampled by V2's own code on each rank's shard and the
  ranks exchange one (value, id) per row (gatherwise.engine_hooks.adapters.vllm.v2_keyed): the token plain V2
  samples, bit for bit, with seeds or without (an unseeded request's seed is drawn at `add_request` by every
  rank alike). The rest run all_gather, recorded as such, and the reason is said once.

`engine.sampler: gatherwise` does not apply under V2: V2's keyed sampler already gives the same tokens in every
mode and batch, so sampled batches keep it (said once, and `/v1/engine` names V2's sampler).

Still refused, once per worker by name: batch-sharded sampling (`--enable-batch-sharded-sampling`: V2 then
exchanges the logits by its own all_to_all, which no hook sees), speculative decoding, pipeline parallelism.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from gatherwise.config import GatherwiseConfig
from gatherwise.engine_hooks.adapters.rank_hooks import mask_padding
from gatherwise.engine_hooks.adapters.vllm.tp_group import tp_rank
from gatherwise.engine_hooks.adapters.vllm.v1_step import VllmStepHooks
from gatherwise.engine_hooks.adapters.vllm.v2_batch import v2_batch
from gatherwise.engine_hooks.adapters.vllm.v2_keyed import KeyedShard, kernel_problem
from gatherwise.modes import Mode

log = logging.getLogger("gatherwise.vllm")


@dataclass
class V2Step:
    input_batch: Any  # the step's vllm.v1.worker.gpu.input_batch.InputBatch
    structured: bool  # the step carries a grammar bitmask


@dataclass
class KeyedCall:
    shard: torch.Tensor  # this rank's [B, width] logits (padding at -inf)
    kind: int
    t_start: int


class VllmV2StepHooks(VllmStepHooks):
    """V1's hooks plus V2's step scope and sampler: one object per worker, whichever runner vLLM builds."""

    def __init__(self, config: GatherwiseConfig) -> None:
        super().__init__(config)
        self._v2: V2Step | None = None  # inside V2's GPUModelRunner.sample
        self._keyed: KeyedCall | None = None  # a sharded keyed call whose sampling is still to come
        self._keyed_rows = KeyedShard()
        self._v2_seen = False
        self._keyed_problem: str | None = None  # why V2's Gumbel kernel cannot be launched on a shard

    @contextmanager
    def v2_step(self, runner: Any, input_batch: Any, grammar_output: Any) -> Iterator[None]:
        if not self._v2_seen:
            self._first_v2_step(runner)
        self._runner, self._v2 = runner, V2Step(input_batch, grammar_output is not None)
        try:
            yield
        finally:
            self._runner = self._v2 = None
        if self.installed is None and self.disabled is None and getattr(input_batch, "num_reqs", 0) > 0:
            self._disable("never_engaged", f"{type(runner).__qualname__}.sample computed its step's logits without "
                          "vLLM's TP logits gather, which the hooks wrap (a logits path the adapter does not know)",
                          tp_rank())

    def _first_v2_step(self, runner: Any) -> None:
        self._v2_seen = True
        if self.installed is not None or self.disabled is not None:
            return
        if self._refused_single_rank():
            return
        if getattr(runner, "batch_sharder", None) is not None:
            self._disable("unsupported_feature", "batch-sharded sampling (--enable-batch-sharded-sampling) exchanges "
                          "the logits by vLLM's own all_to_all, which gatherwise does not hook", tp_rank())
            return
        self._keyed_problem = kernel_problem()
        if self._keyed_problem is not None and tp_rank() == 0:
            log.warning("gatherwise: sampled batches under a sharded table run all_gather: %s", self._keyed_problem)
        if self._gatherwise_samples:
            self._gatherwise_samples = False  # this worker runs V2: its keyed sampler is kept
            if tp_rank() == 0:
                log.info("gatherwise: engine.sampler: gatherwise does not apply under Model Runner V2, whose keyed "
                         "sampler already gives the same tokens in every mode and batch; V2's sampler samples")

    def sampler_labels(self) -> dict[str, str]:
        if not self._v2_seen:
            return super().sampler_labels()
        return {"all_gather": "vLLM's sampler (Model Runner V2), every rank",
                "gather": "vLLM's sampler (Model Runner V2) on rank 0, tokens broadcast",
                "sharded": "vLLM's keyed sampler (Model Runner V2) on each shard, one (value, id) per row exchanged, "
                           "for greedy, temperature and penalty batches; other batches all_gather and vLLM's sampler"}

    # -- LogitsProcessor._gather_logits ---------------------------------------------------------------------
    def gather_logits(self, processor: Any, logits: torch.Tensor, original: Callable) -> torch.Tensor:
        step = self._v2
        if step is None:
            return super().gather_logits(processor, logits, original)
        runner = self._runner
        rows = logits.shape[0]
        logits_path = self._path(runner, logits) if rows else None
        if logits_path is None:
            return original(processor, logits)
        t_start = logits_path.clock()
        buf = logits_path.logits_buffer(rows)
        buf.copy_(logits)
        # every rank decides from the same table and the same sampler state (built from the broadcast
        # scheduler output), so every rank reaches the same decision
        mode = logits_path.begin_call(rows)
        batch = v2_batch(runner.sampler, step.input_batch, processor, step.structured, rows)
        if mode == Mode.SHARDED:
            reason = batch.sharded_reason or (None if batch.raw_argmax else self._keyed_problem)
            if reason is None:
                self._pending = Mode.SHARDED
                real_vocab = getattr(processor, "org_vocab_size", None)
                if batch.raw_argmax:
                    return self._sharded_argmax(logits_path, buf, real_vocab, logits)
                mask_padding(logits_path, buf, real_vocab)
                self._keyed = KeyedCall(buf, batch.kind, t_start)
                return self._placeholder_logits(logits_path, logits)
            self._say_once(reason, "gatherwise: a batch with %s runs all_gather under a sharded table (Model Runner "
                           "V2 samples it from the full logits)")
            allowed = False
        else:
            allowed = mode != Mode.GATHER or batch.gather_reason is None
        mode, shards = logits_path.exchange(mode=None if allowed else Mode.ALL_GATHER, t_start=t_start,
                                            kind=batch.kind)
        self._pending = mode
        return self._engine_logits(logits_path, mode, shards, logits)

    # -- V2 Sampler.sample ------------------------------------------------------------------------------------
    def v2_sample(self, sampler: Any, original: Callable, logits: torch.Tensor, batch: tuple[Any, ...],
                  *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        mode, self._pending = self._pending, None
        if mode is None:
            return original(sampler, logits, *batch, *args, **kwargs)
        logits_path = self.logits_path
        clock = logits_path.clock
        tokens, self._sharded_tokens = self._sharded_tokens, None
        if tokens is not None:  # a sharded greedy call, resolved at the logits call
            return tokens, logits
        keyed, self._keyed = self._keyed, None
        if keyed is not None:
            start = clock()
            values, ids = self._keyed_rows.winners(sampler, keyed.shard, logits_path.rank * logits_path.width,
                                                   logits.shape[-1], batch)
            tokens = logits_path.run_winners(values, ids, keyed.kind, t_start=keyed.t_start, sample_start=start,
                                             sample_end=clock())
            return tokens, logits
        assert mode != Mode.SHARDED, "a sharded call is resolved at the logits call or above"
        if mode == Mode.ALL_GATHER or logits_path.rank == 0:
            start = clock()
            out = original(sampler, logits, *batch, *args, **kwargs)
            end = clock()
            logits_path.complete(out[0].view(-1) if mode != Mode.ALL_GATHER else None, sample_start=start,
                                 sample_end=end)
            return out
        received = logits_path.complete(None)
        assert received is not None, "a rank that did not sample gets the tokens from the path"
        return received, logits
