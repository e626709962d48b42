"""What the vLLM patches do inside one worker (one TP rank): the logits collective of a step, and its sampling.

A step's logits call is the `compute_logits` inside V1's `GPUModelRunner.execute_model` (CPUModelRunner
inherits it); vLLM's sampler consumes it in the following `sample_tokens`, after the grammar bitmask of
structured-output requests has been applied to the full logits. Only that call goes through gatherwise: the
logits calls vLLM makes outside a step on purpose (the warm-up sampler run, prompt logprobs) keep vLLM's own
all_gather, so the sequence of hooked calls is the same on every rank and each one is followed by exactly one
sampler call. Any other logits call outside a hooked step means the hooks do not see the engine's steps: it is
reported once, by name, in the log and to the sidecar (vllm.worker).

- all_gather mode: the hooked collective returns the full logits to vLLM as usual; every rank samples with
  vLLM's sampler, as vLLM does without the plugin.
- gather mode: rank 0 gets the full logits and samples with vLLM's own sampler (grammar mask, penalties,
  logprobs and all); the other ranks get placeholder logits, skip the sampler and receive rank 0's token ids
  (plus the control word) by one broadcast, then go on as if they had sampled. Sampled batches too: vLLM keeps
  its ranks in step by drawing alike on every rank (torch's default generator, and one generator per seeded
  request); a rank that skipped draws adopts rank 0's generator states right before it draws again
  (gatherwise.engine_hooks.rng_resync), so every rank holds what it would have held had it sampled itself.
- sharded mode: every rank reduces its own shard to (max, index) per row and one all_gather of those pairs
  gives every rank the argmax (gatherwise.engine_hooks.sharded_exchange); all ranks get placeholder logits, skip vLLM's
  sampler and return those tokens. Only for batches whose greedy token is the argmax of the raw logits
  (`sharded_greedy_ok`, `raw_argmax_is_kept`: no soft cap or logit scale, which vLLM applies after the gather)
  and that hold no structured-output request (the grammar bitmask is applied after the collective, to the full
  logits); other batches in a sharded bucket run all_gather, recorded as such.
- `engine.sampler: gatherwise`: a sampled batch that gatherwise's sampler honours exactly (temperature,
  top-k, top-p, min-p, greedy rows among them; nothing else vLLM would apply to its logits:
  vllm.v1_sampler_rows) is sampled by it in the table's mode, sharded included,
  keyed per request and output position: every rank gets the same tokens, whatever the mode or the batch, and
  skips vLLM's sampler. A sharded call runs whole in the logits call (LogitsPath.run), as a sharded greedy
  one; an all_gather or gather call runs its collective there and its draw (and gather's token broadcast) at
  vLLM's sampler call, where vLLM's own sampled calls finish theirs. (Run whole in the logits call, gather
  mode stalled both ranks on vLLM's CPU shared-memory transport; split like this it runs.) No rank draws
  from vLLM's generators in such a call, so they stay in step. Other sampled batches keep vLLM's sampler.
- Where skipping the sampler could leave a rank's state behind rank 0's (the thinking-budget state, which
  vLLM's sampler updates; logits processors other than vLLM's built-ins, which may keep state), gather mode
  runs all_gather instead (`gather_ok`), recorded as such.

What each batch allows is decided in vllm.v1_batch; the worker's shared state and the installation are in
vllm.worker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from gatherwise.engine_hooks.adapters.batch_verdict import Sampler, route
from gatherwise.engine_hooks.adapters.open_call import OpenCall
from gatherwise.engine_hooks.adapters.rank_hooks import mask_padding
from gatherwise.engine_hooks.adapters.vllm.tp_group import tp_rank
from gatherwise.engine_hooks.adapters.vllm.v1_batch import v1_batch
from gatherwise.engine_hooks.adapters.vllm.v1_sampler_rows import sampler_rows, step_aside_reason
from gatherwise.engine_hooks.adapters.vllm.worker import VllmWorker
from gatherwise.engine_hooks.sampling_params import SamplingRow
from gatherwise.modes import Mode


class V1StepHooks:
    """The V1 runner's step scope, logits call and sampler call, over the worker's shared state."""

    def __init__(self, worker: VllmWorker) -> None:
        self.worker = worker
        self._structured = False  # the step inside execute_model has structured-output requests

    # -- GPUModelRunner.execute_model -----------------------------------------------------------------------
    @contextmanager
    def step(self, runner: Any, scheduler_output: Any) -> Iterator[None]:
        worker = self.worker
        self._structured = bool(getattr(scheduler_output, "has_structured_output_requests", False))
        if worker.installed is None and worker.disabled is None and not worker.refused_runner(runner):
            worker.refused_single_rank()
        if worker.resync is not None and worker.resync.stale_requests:
            worker.resync.finished(getattr(scheduler_output, "finished_req_ids", ()))
        with worker.step(runner, self):
            yield
        if worker.installed is None and worker.disabled is None and _computed_logits(runner):
            worker.disable("never_engaged", f"{type(runner).__qualname__}.execute_model computed its step's logits "
                           "without vLLM's TP logits gather, which the hooks wrap (a logits path the adapter does "
                           "not know)", tp_rank())

    # -- LogitsProcessor._gather_logits, inside the step ----------------------------------------------------------
    def gather_logits(self, processor: Any, logits: torch.Tensor, original: Callable) -> torch.Tensor:
        worker = self.worker
        runner = worker.runner
        logits_path = worker.path(logits)
        if logits_path is None:
            return original(processor, logits)
        rows = logits.shape[0]
        buf = logits_path.logits_buffer(rows)
        buf.copy_(logits)  # the one copy vLLM's own all_gather does not make
        metadata = runner.input_batch.sampling_metadata
        # Every rank decides from the same table, the same (broadcast) sampling metadata and scheduler output.
        # begin_call adopts what is due for this call and returns its mode; exchange()/run() do not repeat it.
        table_mode = logits_path.begin_call(rows)
        real_vocab = getattr(processor, "org_vocab_size", None)  # vLLM pads the LM head; it trims after the gather
        sampled = None
        if worker.gatherwise_samples and not metadata.all_greedy:
            sampled = self._gatherwise_rows(runner, processor, metadata, rows)
        verdict = v1_batch(metadata, processor, self._structured, sampled)
        sampler, mode = route(table_mode, verdict)
        if sampler == Sampler.ARGMAX:
            return worker.sharded_argmax(logits_path, buf, real_vocab, logits)
        if sampler == Sampler.GATHERWISE and sampled is not None:
            if mode == Mode.SHARDED:
                return worker.sample_now(logits_path, mode, sampler, buf, real_vocab, logits, sampled, None)
            # all_gather and gather: the collective now, the draw at vLLM's sampler
            mask_padding(logits_path, buf, real_vocab)
            mode, shards = logits_path.exchange(kind=verdict.kind)
            worker.call = OpenCall(mode, sampler, rows, shards=shards, sampled_rows=sampled)
            return worker.placeholder_logits(logits_path, logits)
        mode, shards = logits_path.exchange(mode=mode, kind=verdict.kind)
        worker.call = OpenCall(mode, sampler, rows)
        if not metadata.all_greedy:
            all_ranks_sample = mode == Mode.ALL_GATHER
            # per-request generators matter where a rank skips them now, or where one was skipped before
            seeded = metadata.generators and (not all_ranks_sample or worker.resync.stale_requests)
            worker.resync.before_call(all_ranks_sample, True, _request_generators(runner, metadata) if seeded else None)
        return worker.engine_logits(logits_path, mode, shards, logits)

    def _gatherwise_rows(self, runner: Any, processor: Any, metadata: Any, rows: int) -> list[SamplingRow] | None:
        """The rows of gatherwise's sampler for this sampled batch, or None when it steps aside to vLLM's sampler
        (said once per reason; its call then runs as it would without engine.sampler: gatherwise)."""
        reason = step_aside_reason(metadata, processor, self._structured)
        sampled = None if reason else sampler_rows(runner.input_batch, runner.requests, rows,
                                                   self.worker.config.engine.sampler_seed)
        if sampled is None:
            self.worker.say_once(reason or "logits rows that are not one per request with sampling parameters",
                                 "gatherwise: a sampled batch keeps vLLM's sampler (%s), which gatherwise's sampler "
                                 "does not apply; under a sharded table it runs all_gather")
        return sampled

    # -- Sampler.forward ------------------------------------------------------------------------------------
    def sample(self, sampler: Any, original: Callable, logits: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        worker = self.worker
        call = worker.take_call()
        if call is None:
            if worker.resync is not None:  # an unhooked call samples on every rank: they must draw alike
                metadata = args[0] if args else kwargs.get("sampling_metadata")
                worker.resync.before_call(True, not getattr(metadata, "all_greedy", False))
            return original(sampler, logits, *args, **kwargs)
        if call.shards is not None and call.sampled_rows is not None:  # gatherwise's draw, on every rank
            call.tokens = worker.logits_path.draw(call.mode, call.shards, call.sampled_rows)
        elif call.tokens is None:
            out = worker.finish_around_sampler(call, lambda: original(sampler, logits, *args, **kwargs),
                                               lambda out: out.sampled_token_ids.view(-1))
            if out is not None:
                return out
        from vllm.v1.outputs import SamplerOutput

        # gatherwise's tokens, or rank 0's where this rank skipped the sampler: only rank 0's output reaches the
        # client (vLLM's unique reply rank), so its logprobs are the ones returned
        assert call.tokens is not None
        return SamplerOutput(sampled_token_ids=call.tokens.to(torch.int32).unsqueeze(-1), logprobs_tensors=None)


def _request_generators(runner: Any, metadata: Any) -> dict[str, torch.Generator]:
    """{request id: its generator} of the batch's seeded rows, in batch order (the same on every rank)."""
    generators = metadata.generators
    if not generators:
        return {}
    req_ids = runner.input_batch.req_ids
    return {req_ids[row]: gen for row, gen in sorted(generators.items())}


def _computed_logits(runner: Any) -> bool:
    """Whether V1's execute_model left logits for sample_tokens (a forward that produced them, not a dummy)."""
    state = getattr(runner, "execute_model_state", None)
    return getattr(state, "logits", None) is not None
