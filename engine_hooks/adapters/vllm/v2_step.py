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
  vllm.v2_batch) is sampled by V2's own code on each rank's shard and the
  ranks exchange one (value, id) per row (vllm.v2_keyed): the token plain V2
  samples, bit for bit, with seeds or without (an unseeded request's seed is drawn at `add_request` by every
  rank alike). The rest run all_gather, recorded as such, and the reason is said once.

`engine.sampler: gatherwise` does not apply under V2: V2's keyed sampler already gives the same tokens in every
mode and batch, so sampled batches keep it (said once, and `/v1/engine` names V2's sampler).

V2's hooks share the worker's state and installation (vllm.worker) with V1's, and import nothing of V1's.

Still refused, once per worker by name: batch-sharded sampling (`--enable-batch-sharded-sampling`: V2 then
exchanges the logits by its own all_to_all, which no hook sees), speculative decoding, pipeline parallelism.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from gatherwise.engine_hooks.adapters.batch_verdict import Sampler, route
from gatherwise.engine_hooks.adapters.open_call import OpenCall
from gatherwise.engine_hooks.adapters.rank_hooks import mask_padding
from gatherwise.engine_hooks.adapters.vllm.tp_group import tp_rank
from gatherwise.engine_hooks.adapters.vllm.v2_batch import v2_batch
from gatherwise.engine_hooks.adapters.vllm.v2_keyed import KeyedShard, kernel_problem
from gatherwise.engine_hooks.adapters.vllm.worker import VllmWorker
from gatherwise.modes import Mode

log = logging.getLogger("gatherwise.vllm")
V2_LABELS = {"all_gather": "vLLM's sampler (Model Runner V2), every rank",
             "gather": "vLLM's sampler (Model Runner V2) on rank 0, tokens broadcast",
             "sharded": "vLLM's keyed sampler (Model Runner V2) on each shard, one (value, id) per row exchanged, "
                        "for greedy, temperature and penalty batches; other batches all_gather and vLLM's sampler"}


class V2StepHooks:
    """Model Runner V2's step scope, logits call and sampler call, over the worker's shared state."""

    def __init__(self, worker: VllmWorker) -> None:
        self.worker = worker
        self._input_batch: Any = None  # the step's vllm.v1.worker.gpu.input_batch.InputBatch
        self._structured = False  # the step carries a grammar bitmask
        self._keyed_rows = KeyedShard()
        self._seen = False
        self._keyed_problem: str | None = None  # why V2's Gumbel kernel cannot be launched on a shard

    # -- V2 GPUModelRunner.sample ---------------------------------------------------------------------------------
    @contextmanager
    def step(self, runner: Any, input_batch: Any, grammar_output: Any) -> Iterator[None]:
        worker = self.worker
        if not self._seen:
            self._first_step(runner)
        self._input_batch, self._structured = input_batch, grammar_output is not None
        try:
            with worker.step(runner, self):
                yield
        finally:
            self._input_batch = None
        if worker.installed is None and worker.disabled is None and getattr(input_batch, "num_reqs", 0) > 0:
            worker.disable("never_engaged", f"{type(runner).__qualname__}.sample computed its step's logits without "
                           "vLLM's TP logits gather, which the hooks wrap (a logits path the adapter does not know)",
                           tp_rank())

    def _first_step(self, runner: Any) -> None:
        self._seen = True
        worker = self.worker
        worker.runner_labels = V2_LABELS
        if worker.installed is not None or worker.disabled is not None:
            return
        if worker.refused_runner(runner) or worker.refused_single_rank():
            return
        if getattr(runner, "batch_sharder", None) is not None:
            worker.disable("unsupported_feature", "batch-sharded sampling (--enable-batch-sharded-sampling) exchanges "
                           "the logits by vLLM's own all_to_all, which gatherwise does not hook", tp_rank())
            return
        self._keyed_problem = kernel_problem()
        if self._keyed_problem is not None and tp_rank() == 0:
            log.warning("gatherwise: sampled batches under a sharded table run all_gather: %s", self._keyed_problem)
        if worker.gatherwise_samples:
            worker.gatherwise_samples = False  # this worker runs V2: its keyed sampler is kept
            if tp_rank() == 0:
                log.info("gatherwise: engine.sampler: gatherwise does not apply under Model Runner V2, whose keyed "
                         "sampler already gives the same tokens in every mode and batch; V2's sampler samples")

    # -- LogitsProcessor._gather_logits, inside the step ----------------------------------------------------------
    def gather_logits(self, processor: Any, logits: torch.Tensor, original: Callable) -> torch.Tensor:
        worker = self.worker
        runner = worker.runner
        rows = logits.shape[0]
        logits_path = worker.path(logits) if rows else None
        if logits_path is None:
            return original(processor, logits)
        t_start = logits_path.clock()
        buf = logits_path.logits_buffer(rows)
        buf.copy_(logits)
        # every rank decides from the same table and the same sampler state (built from the broadcast
        # scheduler output), so every rank reaches the same decision
        table_mode = logits_path.begin_call(rows)
        verdict = v2_batch(runner.sampler, self._input_batch, processor, self._structured, rows)
        if self._keyed_problem is not None and not verdict.raw_argmax and verdict.sharded_reason is None:
            verdict = dataclasses.replace(verdict, sharded_reason=self._keyed_problem)
        sampler, mode = route(table_mode, verdict)
        real_vocab = getattr(processor, "org_vocab_size", None)
        if sampler == Sampler.ARGMAX:
            return worker.sharded_argmax(logits_path, buf, real_vocab, logits)
        if sampler == Sampler.ENGINE_ON_SHARDS:  # the shard's winners at V2's sampler call
            mask_padding(logits_path, buf, real_vocab)
            worker.call = OpenCall(mode, sampler, rows, shards=buf, kind=verdict.kind, t_start=t_start)
            return worker.placeholder_logits(logits_path, logits)
        reason = verdict.aside_reason(table_mode)
        if reason is not None and table_mode == Mode.SHARDED:
            worker.say_once(reason, "gatherwise: a batch with %s runs all_gather under a sharded table (Model Runner "
                            "V2 samples it from the full logits)")
        mode, shards = logits_path.exchange(mode=mode, t_start=t_start, kind=verdict.kind)
        worker.call = OpenCall(mode, sampler, rows)
        return worker.engine_logits(logits_path, mode, shards, logits)

    # -- V2 Sampler.sample ------------------------------------------------------------------------------------
    def sample(self, sampler: Any, original: Callable, logits: torch.Tensor, batch: tuple[Any, ...],
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        worker = self.worker
        call = worker.take_call()
        if call is None:
            return original(sampler, logits, *batch, *args, **kwargs)
        if call.sampler == Sampler.ENGINE_ON_SHARDS and call.shards is not None:
            logits_path = worker.logits_path
            start = logits_path.clock()
            values, ids = self._keyed_rows.winners(sampler, call.shards, logits_path.rank * logits_path.width,
                                                   logits.shape[-1], batch)
            call.tokens = logits_path.run_winners(values, ids, call.kind, t_start=call.t_start, sample_start=start,
                                                  sample_end=logits_path.clock())
        elif call.tokens is None:
            out = worker.finish_around_sampler(call, lambda: original(sampler, logits, *batch, *args, **kwargs),
                                               lambda out: out[0].view(-1))
            if out is not None:
                return out
        assert call.tokens is not None
        return call.tokens, logits
