"""What the vLLM patches do inside one worker (one TP rank): the logits collective of a step, and its sampling.

A step's logits call is the `compute_logits` inside V1's `GPUModelRunner.execute_model` (CPUModelRunner
inherits it); vLLM's sampler consumes it in the following `sample_tokens`, after the grammar bitmask of
structured-output requests has been applied to the full logits. Only that call goes through gatherwise: the
logits calls vLLM makes outside a step on purpose (the warm-up sampler run, prompt logprobs) keep vLLM's own
all_gather, so the sequence of hooked calls is the same on every rank and each one is followed by exactly one
sampler call. Any other logits call outside a hooked step means the hooks do not see the engine's steps: it is
reported once, by name, in the log and to the sidecar (gatherwise.engine_hooks.adapters.hooks_off).

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
  gatherwise.engine_hooks.adapters.vllm.v1_sampler_rows) is sampled by it in the table's mode, sharded included,
  keyed per request and output position: every rank gets the same tokens, whatever the mode or the batch, and
  skips vLLM's sampler. A sharded call runs whole in the logits call (LogitsPath.run), as a sharded greedy
  one; an all_gather or gather call runs its collective there and its draw (and gather's token broadcast) at
  vLLM's sampler call, where vLLM's own sampled calls finish theirs. (Run whole in the logits call, gather
  mode stalled both ranks on vLLM's CPU shared-memory transport; split like this it runs.) No rank draws
  from vLLM's generators in such a call, so they stay in step. Other sampled batches keep vLLM's sampler.
- Where skipping the sampler could leave a rank's state behind rank 0's (the thinking-budget state, which
  vLLM's sampler updates; logits processors other than vLLM's built-ins, which may keep state), gather mode
  runs all_gather instead (`gather_ok`), recorded as such.

The hooks are installed lazily at the first hooked call (torch.distributed and vLLM's TP group exist by then):
handshake, engine id, ring recorder and control block come from gatherwise.engine_hooks.install.install_hooks.
"""

from __future__ import annotations

import logging
import multiprocessing.util
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import torch

from gatherwise.call_kind import call_kind, sampling_of_rows
from gatherwise.config import GatherwiseConfig
from gatherwise.engine_hooks.adapters.hooks_off import report_hooks_off
from gatherwise.engine_hooks.adapters.rank_hooks import RankHooks, mask_padding, shard_shape_problem
from gatherwise.engine_hooks.adapters.sampler_rows import gatherwise_samples
from gatherwise.engine_hooks.adapters.vllm.tp_group import tp_rank, tp_world_size
from gatherwise.engine_hooks.adapters.vllm.v1_sampler_rows import builtin_is_idle, sampler_rows, step_aside_reason
from gatherwise.engine_hooks.sampling_params import SamplingRow, kind_of_rows
from gatherwise.modes import Mode

log = logging.getLogger("gatherwise.vllm")
_FINALIZE_PRIORITY = 10  # multiprocessing runs finalizers that have an exit priority when a worker exits, highest first


class VllmStepHooks(RankHooks):
    ENGINE = "vLLM"
    DISTRIBUTION = "vllm"

    def __init__(self, config: GatherwiseConfig) -> None:
        super().__init__(config, log)
        self._runner: Any = None  # the model runner inside execute_model, else None
        self._structured = False  # the step inside execute_model has structured-output requests
        self._unhooked_depth = 0  # inside one of vLLM's own logits calls outside a step (warm-up, prompt logprobs)
        self._unhooked_reported = False  # a logits gather outside every hooked step was reported
        self._pending: Mode | None = None  # mode of the hooked call whose sampling is still to come
        self._resync: Any = None  # gatherwise.engine_hooks.rng_resync.RandomStateResync, with the hooks
        self._gatherwise_samples = gatherwise_samples(config)  # engine.sampler: gatherwise
        self._gatherwise_call: tuple[torch.Tensor, list[SamplingRow]] | None = None  # shards and rows to draw
        self._stepped_aside: set[str] = set()  # why sampled batches kept vLLM's sampler (each said once)

    def model_name(self) -> str:
        """The served model name (vLLM's --served-model-name, else the model it loaded), read from the runner of
        the step that installs the hooks."""
        model_config = getattr(self._runner, "model_config", None)
        name = getattr(model_config, "served_model_name", None)
        name = name[0] if isinstance(name, (list, tuple)) and name else name
        name = name if isinstance(name, str) and name else getattr(model_config, "model", "")
        return name if isinstance(name, str) else ""

    # -- scope: the step's logits call --------------------------------------------------------------------
    @contextmanager
    def step(self, runner: Any, scheduler_output: Any) -> Iterator[None]:
        self._runner = runner
        self._structured = bool(getattr(scheduler_output, "has_structured_output_requests", False))
        if self.installed is None and self.disabled is None:
            self._refused_single_rank()
        if self._resync is not None and self._resync.stale_requests:
            self._resync.finished(getattr(scheduler_output, "finished_req_ids", ()))
        try:
            yield
        finally:
            self._runner = None
        if self.installed is None and self.disabled is None and _computed_logits(runner):
            self._disable("never_engaged", f"{type(runner).__qualname__}.execute_model computed its step's logits "
                          "without vLLM's TP logits gather, which the hooks wrap (a logits path the adapter does "
                          "not know)", tp_rank())

    @contextmanager
    def unhooked_scope(self) -> Iterator[None]:
        self._unhooked_depth += 1
        try:
            yield
        finally:
            self._unhooked_depth -= 1

    def _refused_single_rank(self) -> bool:
        """Hooks off (said once) in a TP=1 worker: vLLM makes no logits collective there."""
        if tp_world_size() != 1:
            return False
        self._disable("single_rank", "TP=1: vLLM makes no logits collective, so there is nothing to hook", 0)
        return True

    def _say_once(self, reason: str, message: str) -> None:
        """Log `message` (its %s is the reason) on TP rank 0, once per reason a batch stepped aside for."""
        if reason not in self._stepped_aside:
            self._stepped_aside.add(reason)
            if tp_rank() == 0:
                log.info(message, reason)

    def _disable(self, reason: str, why: str, rank: int | None = None) -> None:
        self.disabled = why
        report_hooks_off(log, "vLLM", reason, f"hooks stay off in this vLLM worker: {why}; vLLM's own logits path "
                         "runs", self.config, rank)

    def samples_with_gatherwise(self) -> bool:
        return self._gatherwise_samples

    def _report_unhooked_call(self) -> None:
        self._unhooked_reported = True  # said once: later such calls cost nothing more than vLLM's own
        caller = _runner_frame_name()
        engaged = "" if self.installed is None else " (the hooks are installed, but this call bypasses them)"
        report_hooks_off(log, "vLLM", "unhooked_logits_calls",
                         f"vLLM's logits gather ran outside a hooked step, called from {caller}{engaged}; gatherwise "
                         "neither times nor switches such calls (vLLM's own all_gather runs)", self.config, tp_rank())

    def _path(self, runner: Any, logits: torch.Tensor):
        if self.installed is not None:
            return self.logits_path
        if self.disabled is not None:
            return None
        # Every rank reaches the same decision here from the same config, so no rank waits alone.
        from vllm.distributed.parallel_state import get_pp_group, get_tp_group

        rank = get_tp_group().rank_in_group
        if getattr(runner, "speculative_config", None) is not None:
            self._disable("unsupported_feature", "speculative decoding is not supported", rank)
            return None
        if get_pp_group().world_size > 1:
            self._disable("unsupported_feature", "pipeline parallelism is not supported", rank)
            return None
        problem = shard_shape_problem(logits)
        if problem:
            self._disable("logits_shape", problem, rank)
            return None
        from gatherwise.engine_hooks.adapters.vllm.comm import VllmGroupCommunicator
        from gatherwise.engine_hooks.rng_resync import RandomStateResync

        comm = VllmGroupCommunicator(get_tp_group())
        logits_path = self._install(comm, logits)
        self._resync = RandomStateResync(comm, logits.device)
        # a forked vLLM worker ends through multiprocessing, which skips atexit but runs its finalizers
        multiprocessing.util.Finalize(None, self.close, exitpriority=_FINALIZE_PRIORITY)
        return logits_path

    # -- LogitsProcessor._gather_logits ---------------------------------------------------------------------
    def gather_logits(self, processor: Any, logits: torch.Tensor, original: Callable) -> torch.Tensor:
        runner = self._runner
        if runner is None:
            if self._unhooked_depth == 0 and self.disabled is None and not self._unhooked_reported:
                self._report_unhooked_call()
            return original(processor, logits)
        logits_path = self._path(runner, logits)
        if logits_path is None:
            return original(processor, logits)
        rows = logits.shape[0]
        buf = logits_path.logits_buffer(rows)
        buf.copy_(logits)  # the one copy vLLM's own all_gather does not make
        metadata = runner.input_batch.sampling_metadata
        # Every rank decides from the same table, the same (broadcast) sampling metadata and scheduler output.
        # begin_call adopts what is due for this call and returns its mode; exchange()/run() do not repeat it.
        mode = logits_path.begin_call(rows)
        real_vocab = getattr(processor, "org_vocab_size", None)  # vLLM pads the LM head; it trims after the gather
        if self._gatherwise_samples and not metadata.all_greedy:
            sampled = self._gatherwise_rows(runner, processor, metadata, rows)
            if sampled is not None:
                self._pending = mode
                if mode == Mode.SHARDED:
                    return self._path_samples(logits_path, buf, real_vocab, logits, sampled, None)
                # all_gather and gather: the collective now, the draw at vLLM's sampler call (sample())
                mask_padding(logits_path, buf, real_vocab)
                _, shards = logits_path.exchange(kind=kind_of_rows(sampled))
                self._gatherwise_call = (shards, sampled)
                return self._placeholder_logits(logits_path, logits)
        if mode == Mode.SHARDED:
            if not self._structured and raw_argmax_is_kept(processor) and sharded_greedy_ok(metadata):
                self._pending = Mode.SHARDED
                return self._sharded_argmax(logits_path, buf, real_vocab, logits)
            allowed = False  # the token is not the raw argmax here: all_gather, as vLLM does
        else:
            allowed = mode != Mode.GATHER or gather_ok(metadata)
        mode, shards = logits_path.exchange(mode=None if allowed else Mode.ALL_GATHER, kind=call_kind_of(metadata))
        self._pending = mode
        if not metadata.all_greedy:
            all_ranks_sample = mode == Mode.ALL_GATHER
            # per-request generators matter where a rank skips them now, or where one was skipped before
            seeded = metadata.generators and (not all_ranks_sample or self._resync.stale_requests)
            self._resync.before_call(all_ranks_sample, True, _request_generators(runner, metadata) if seeded else None)
        return self._engine_logits(logits_path, mode, shards, logits)

    def _gatherwise_rows(self, runner: Any, processor: Any, metadata: Any, rows: int) -> list[SamplingRow] | None:
        """The rows of gatherwise's sampler for this sampled batch, or None when it steps aside to vLLM's sampler
        (said once per reason; its call then runs as it would without engine.sampler: gatherwise)."""
        reason = step_aside_reason(metadata, processor, self._structured)
        sampled = None if reason else sampler_rows(runner.input_batch, runner.requests, rows,
                                                       self.config.engine.sampler_seed)
        if sampled is None:
            self._say_once(reason or "logits rows that are not one per request with sampling parameters",
                           "gatherwise: a sampled batch keeps vLLM's sampler (%s), which gatherwise's sampler does "
                           "not apply; under a sharded table it runs all_gather")
        return sampled

    # -- Sampler.forward ------------------------------------------------------------------------------------
    def sample(self, sampler: Any, original: Callable, logits: torch.Tensor, *args: Any, **kwargs: Any):
        mode, self._pending = self._pending, None
        if mode is None:
            if self._resync is not None:  # an unhooked call samples on every rank: they must draw alike
                metadata = args[0] if args else kwargs.get("sampling_metadata")
                self._resync.before_call(True, not getattr(metadata, "all_greedy", False))
            return original(sampler, logits, *args, **kwargs)
        logits_path = self.logits_path
        tokens: torch.Tensor | None
        if self._gatherwise_call is not None:
            (shards, rows), self._gatherwise_call = self._gatherwise_call, None
            tokens = logits_path.draw(mode, shards, rows)
        else:
            tokens, self._sharded_tokens = self._sharded_tokens, None
        if tokens is not None:  # gatherwise's sampler drew them (_path_samples, LogitsPath.draw), on every rank
            from vllm.v1.outputs import SamplerOutput

            return SamplerOutput(sampled_token_ids=tokens.to(torch.int32).unsqueeze(-1), logprobs_tensors=None)
        assert mode != Mode.SHARDED, "a sharded call samples in gather_logits"
        clock = getattr(logits_path, "clock", time.perf_counter_ns)
        if mode == Mode.ALL_GATHER or logits_path.rank == 0:
            start = clock()
            out = original(sampler, logits, *args, **kwargs)
            end = clock()
            tokens = out.sampled_token_ids.view(-1) if mode != Mode.ALL_GATHER else None
            logits_path.complete(tokens, sample_start=start, sample_end=end)
            return out
        tokens = logits_path.complete(None)
        assert tokens is not None, "a rank that did not sample gets the tokens from the path"
        from vllm.v1.outputs import SamplerOutput

        # only rank 0's output reaches the client (vLLM's unique reply rank): its logprobs are the ones returned
        return SamplerOutput(sampled_token_ids=tokens.to(torch.int32).unsqueeze(-1), logprobs_tensors=None)


def raw_argmax_is_kept(processor: Any) -> bool:
    """Whether vLLM's LogitsProcessor leaves the gathered logits as they are: its soft cap (tanh) and scale come
    after the gather, and rounding can turn two different logits into a tie there, which moves the argmax."""
    return getattr(processor, "soft_cap", None) is None and getattr(processor, "scale", 1.0) == 1.0


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


def _runner_frame_name() -> str:
    """Who called the logits gather: the nearest caller outside vLLM's model and layers (the runner's method)."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if not module.startswith(("vllm.model_executor", "torch", "gatherwise.engine_hooks")):
            return f"{module}.{getattr(frame.f_code, 'co_qualname', frame.f_code.co_name)}"  # 3.10 has no co_qualname
        frame = frame.f_back
    return "an unknown caller"


def gather_ok(metadata: Any) -> bool:
    """Whether rank 0 alone may run vLLM's sampler while the other ranks skip it: nothing in the sampler keeps
    state the skipping ranks would then lack. vLLM's thinking-budget state is updated inside the sampler, and a
    logits processor that is not one of vLLM's built-ins (whose apply() keeps no state) may keep state."""
    holder = getattr(metadata, "thinking_budget_state_holder", None)
    if holder is not None and holder.has_tracked_requests():
        return False
    procs = metadata.logitsprocs
    return all(type(p).__module__ == _BUILTIN_LOGITSPROCS
               for group in (procs.argmax_invariant, procs.non_argmax_invariant) for p in group)


_BUILTIN_LOGITSPROCS = "vllm.v1.sample.logits_processor.builtin"


def call_kind_of(metadata: Any) -> int:
    """What the batch samples (gatherwise.call_kind), from vLLM's SamplingMetadata (top_p/top_k are None when no
    request of the batch uses them)."""
    sampling = sampling_of_rows(bool(metadata.all_greedy), metadata.top_p is not None,
                                metadata.top_k is not None or getattr(metadata, "min_p", None) is not None)
    return call_kind(sampling, metadata.max_num_logprobs is not None)


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
    return all(builtin_is_idle(proc) for proc in getattr(metadata.logitsprocs, "non_argmax_invariant", ()))
