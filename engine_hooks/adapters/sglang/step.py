"""What the SGLang patches do inside one TP scheduler process (one TP rank): the logits collective of a
generation step, and its sampling.

A step's logits call is the `_logits_gatherer` call inside `LogitsProcessor.forward`, when that forward runs for
a generation batch in `TpModelWorker.forward_batch_generation` (decode, or prefill without input logprobs) that
SGLang samples afterwards, in `Sampler.forward` (directly, or later from the overlap scheduler's delayed
sample; never past the next step's forward). Only that call goes through gatherwise: other logits calls
(input logprobs, prefill-only scoring, speculative verify) keep SGLang's own all_gather, so the sequence of
hooked calls is the same on every rank and each one is followed by exactly one sampler call.

- all_gather mode: the hooked collective returns the full logits as SGLang's all_gather does; every rank
  samples with SGLang's sampler, as SGLang does without the plugin.
- gather mode: rank 0 gets the full logits and samples with SGLang's sampler; the other ranks get placeholder
  logits, skip the sampler, and receive rank 0's ids (plus the control word) by one broadcast at the end of
  `Sampler.forward`, which is where SGLang would sync ids itself. They return them as their own, so the
  overlap scheduler's FutureMap and the output processing of every rank see rank 0's ids. When the batch
  asked for logprobs, the skipping ranks write placeholder logprobs of the right shapes (only rank 0's reach
  the client). SGLang's optional id all_reduce is skipped by rank 0 in that mode: the others do not join it.
- sharded mode: every rank reduces its own shard to (max, index) per row and one all_gather of those pairs
  gives every rank the argmax (engine_hooks.sharded_exchange); all ranks get placeholder logits, skip SGLang's
  sampler and return those ids. Only for batches whose greedy token is the argmax of the raw logits
  (sglang.batch: all greedy, no penalties, logit bias, grammar, custom logit processor, logprobs); other
  batches in a sharded bucket run all_gather (recorded as such).
- Sampled batches run all_gather or gather. SGLang's sampler draws from torch's default generator, seeded alike on
  every rank; ranks that skipped draws in gather mode adopt rank 0's generator state right before they draw
  again (gatherwise.engine_hooks.rng_resync), so every rank draws what plain SGLang draws.
- With `engine.sampler: gatherwise`, sampled batches that gatherwise's sampler can honour exactly
  (sglang.sampled_rows: no logprobs, penalties, logit bias, grammar, custom
  logit processor, watermark, sampling-mask capture, sampling observer, beam search) are sampled at the gather
  by the path itself (LogitsPath.run) in the table's mode, sharded included: every rank gets the same tokens,
  keyed by (seed, request, position), identical in every mode. All ranks get placeholder logits, skip SGLang's
  sampler and return those tokens (int32, as SGLang's sampler would); no rank draws from its generator, so the
  generator hand-over has nothing to track for those calls. Other sampled batches keep SGLang's sampler as
  above; all-greedy batches keep their own route. Such calls never replay a CUDA graph (they run eagerly).
- Features the adapter does not support (speculative decoding, pipeline parallelism, DP attention, the DP or
  all-to-all LM head) are detected at the first step: the hooks stay off with one warning, SGLang runs as is.

With CUDA graphs, SGLang's decode graph capture runs once per mode and each step replays the graph of its mode,
chosen on the host before replay (capture_decode_graphs, can_replay, replay_decode; gatherwise.engine_hooks.adapters.
sglang.graphs holds the bookkeeping, docs/sglang.md the design).

The hooks are installed lazily at the first hooked call (torch.distributed and SGLang's TP group exist by
then): handshake, engine id, ring recorder and control block come from gatherwise.engine_hooks.install.install_hooks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from gatherwise.config import GatherwiseConfig
from gatherwise.engine_hooks.adapters.batch_verdict import Sampler, route
from gatherwise.engine_hooks.adapters.hooks_off import report_hooks_off
from gatherwise.engine_hooks.adapters.open_call import OpenCall
from gatherwise.engine_hooks.adapters.rank_hooks import RankHooks, shard_shape_problem
from gatherwise.engine_hooks.adapters.sampler_rows import gatherwise_samples
from gatherwise.engine_hooks.adapters.sglang.batch import call_kind_of, full_logits_everywhere, sglang_batch
from gatherwise.engine_hooks.adapters.sglang.graphs import DecodeGraphModes, parse_graph_modes
from gatherwise.engine_hooks.adapters.sglang.sampled_rows import batch_rows, refusal
from gatherwise.engine_hooks.adapters.sglang.targets import TP_WORKER_FORWARD
from gatherwise.engine_hooks.logits_path import LogitsPath
from gatherwise.modes import Mode

if TYPE_CHECKING:
    from gatherwise.engine_hooks.fingerprints.engines import InstallCheck

log = logging.getLogger("gatherwise.sglang")
# Where forward_batch_generation takes is_verify and the ScheduleBatch among the positional arguments after self
# (the checked target).
_IS_VERIFY_ARG = TP_WORKER_FORWARD.params.index("is_verify") - 1
_BATCH_ARG = TP_WORKER_FORWARD.params.index("batch") - 1


def unsupported_features(server_args: Any, parallel: Any) -> list[str]:
    """SGLang features whose logits or sampling path the adapter does not hook (from the live server args and
    parallel context; attribute names of SGLang 0.5.23, absent ones count as off)."""
    found = []
    if getattr(server_args, "speculative_algorithm", None):
        found.append(f"speculative decoding ({server_args.speculative_algorithm})")
    if int(getattr(server_args, "pp_size", 1) or 1) > 1:
        found.append("pipeline parallelism")
    if int(getattr(parallel, "attn_dp_size", 1) or 1) > 1 or getattr(server_args, "enable_dp_attention", False):
        found.append("DP attention")
    if getattr(parallel, "enable_dp_lm_head", False) or getattr(server_args, "enable_dp_lm_head", False):
        found.append("enable_dp_lm_head")
    if getattr(parallel, "enable_tp_lm_head_all_to_all", False):
        found.append("the all-to-all TP LM head")
    return found


def sampled_ids_dtype(sampling_info: Any) -> torch.dtype:
    """The dtype SGLang 0.5.23's sampler returns ids in: argmax's int64 for an all-greedy batch, its samplers'
    int32 otherwise. Ranks that receive ids return them in the dtype they would have sampled them in."""
    return torch.int64 if sampling_info.is_all_greedy else torch.int32


def _is_decode(forward_batch: Any) -> bool:
    return getattr(getattr(forward_batch, "forward_mode", None), "name", None) == "DECODE"


def _soft_cap(processor: Any, shard: torch.Tensor) -> None:
    """SGLang's final logit soft-capping (cap * tanh(x / cap), applied to the gathered logits when the model has
    one), in place on this rank's shard: elementwise, so the shards hold what the gathered logits would."""
    cap = getattr(processor, "final_logit_softcapping", None)
    if cap:
        shard.div_(cap).tanh_().mul_(cap)


def _padded(ids: torch.Tensor, pending: OpenCall) -> torch.Tensor:
    """Rank 0's ids of a replayed call, padded to the rows its graph exchanged (the broadcast sends that many)."""
    if pending.real_rows is None or pending.real_rows == pending.rows:
        return ids
    out = torch.zeros(pending.rows, dtype=ids.dtype, device=ids.device)
    out[: ids.numel()] = ids
    return out


_SAMPLED_MODES = ("DECODE", "EXTEND", "MIXED")  # ForwardMode names of batches SGLang samples right after


def hookable(forward_batch: Any) -> bool:
    """A logits call that SGLang samples from right after: decode, or extend/mixed without input logprobs, for
    a batch that is not prefill-only (speculative verify and draft passes never qualify)."""
    mode_name = getattr(getattr(forward_batch, "forward_mode", None), "name", None)
    if mode_name not in _SAMPLED_MODES:
        return False
    if getattr(forward_batch, "sampling_info", None) is None or getattr(forward_batch, "is_prefill_only", False):
        return False
    return mode_name == "DECODE" or not forward_batch.return_logprob  # input logprobs: SGLang's chunked path


class SglangStepHooks(RankHooks):
    ENGINE = "SGLang"
    DISTRIBUTION = "sglang"

    def __init__(self, config: GatherwiseConfig, check: InstallCheck | None = None) -> None:
        super().__init__(config, log, check)
        self.resync: Any = None  # gatherwise.engine_hooks.rng_resync.RandomStateResync, with the hooks
        self.root_samples_alone = False  # rank 0 inside SGLang's sampler in gather mode
        self._in_step = False  # inside TpModelWorker.forward_batch_generation (not a verify pass)
        self._worker: Any = None  # the TpModelWorker of this rank (seen at its first step)
        self._schedule_batch: Any = None  # the ScheduleBatch of the step being run (its requests)
        self.gatherwise_samples = gatherwise_samples(config)  # engine.sampler: gatherwise
        self._refusals: set[str] = set()  # why sampled batches kept SGLang's sampler (each said once)
        self._sanitize_nan = False  # SGLang replaces NaN logits before sampling (SGLANG_SANITIZE_NAN_LOGITS)
        self._forward_batch: Any = None  # the batch of the LogitsProcessor.forward being hooked
        self.graphs = DecodeGraphModes(parse_graph_modes(config.engine.graph_modes))
        self._replay_mode: Mode | None = None  # this step replays that mode's decode graph (can_replay said so)
        self._graph_reserve = 0  # rows the path reserves before the first graph captures its buffers

    # -- scopes ---------------------------------------------------------------------------------------------
    @contextmanager
    def step(self, worker: Any, args: tuple, kwargs: dict) -> Iterator[None]:
        is_verify = kwargs.get("is_verify", args[_IS_VERIFY_ARG] if len(args) > _IS_VERIFY_ARG else False)
        if self._worker is None:
            self.see_runner(worker, "sglang")  # SGLang's one runner
        self._worker = worker
        self._schedule_batch = kwargs.get("batch", args[_BATCH_ARG] if len(args) > _BATCH_ARG else None)
        self._in_step = not is_verify and self.disabled is None
        self._replay_mode = None
        try:
            yield
        finally:
            self._in_step = False
            self._replay_mode = None
            self._schedule_batch = None

    @contextmanager
    def logits_call(self, processor: Any, logits_metadata: Any) -> Iterator[None]:
        capturing = self.graphs.capturing is not None and _is_decode(logits_metadata)
        if not capturing and (not self._in_step or not hookable(logits_metadata)):
            yield
            return
        if not capturing:
            self._in_step = False  # one hooked logits call per step
        self._forward_batch = logits_metadata
        try:
            yield
        finally:
            missed, self._forward_batch = self._forward_batch is not None, None
        if missed and self.disabled is None:  # SGLang took a path that bypasses the gatherer (e.g. fused softcap)
            report_hooks_off(log, "SGLang", "unhooked_logits_calls" if self.installed else "never_engaged",
                             "a generation step's logits did not go through SGLang's logits gatherer on this "
                             "model/config; those steps run SGLang's own logits path", self.config)

    # -- installation ---------------------------------------------------------------------------------------
    def disable(self, reason: str, why: str, rank: int) -> None:
        self.disabled = why
        # every rank decides the same from the same config: one warning, from rank 0
        report_hooks_off(log, "SGLang", reason, f"hooks stay off in this SGLang engine: {why}; SGLang's own logits "
                         "path runs", self.config, rank)

    def _path(self, processor: Any, logits: torch.Tensor) -> LogitsPath | None:
        if self.installed is not None:
            return self.logits_path
        if self.disabled is not None:
            return None
        from sglang.srt.distributed.parallel_state import get_tp_group
        from sglang.srt.runtime_context import get_parallel, get_server_args

        group = get_tp_group()
        rank = int(group.rank_in_group)
        problems = unsupported_features(get_server_args(), get_parallel())
        if getattr(processor, "use_attn_tp_group", False):
            problems.append("the attention-TP LM head")
        shape_problem = shard_shape_problem(logits)
        if shape_problem:
            problems.append(shape_problem)
        if problems:
            self.disable("logits_shape" if problems == [shape_problem] else "unsupported_feature",
                          ", ".join(problems) + " (not supported by gatherwise)", rank)
            return None
        from sglang.srt.environ import envs

        from gatherwise.engine_hooks.adapters.sglang.comm import SglangGroupCommunicator
        from gatherwise.engine_hooks.rng_resync import RandomStateResync

        self._sanitize_nan = bool(envs.SGLANG_SANITIZE_NAN_LOGITS.get())

        if getattr(getattr(self._worker, "model_runner", None), "decode_cuda_graph_runner", None) is not None and \
                not self.graphs.passes and rank == 0:  # graphs captured without gatherwise's capture passes
            log.warning("gatherwise: SGLang replays decode steps from graphs captured without gatherwise's "
                        "per-mode capture here; those steps keep SGLang's captured all_gather and are not recorded "
                        "(eager steps are hooked). Start SGLang with --disable-cuda-graph to hook every step")
        comm = SglangGroupCommunicator(group)
        logits_path = self._install(comm, logits)
        self.resync = RandomStateResync(comm, logits.device)
        return logits_path

    # -- LogitsProcessor._logits_gatherer ---------------------------------------------------------------------
    def gather(self, processor: Any, original: Callable, logits: torch.Tensor) -> torch.Tensor:
        forward_batch, self._forward_batch = self._forward_batch, None
        logits_path = self._path(processor, logits) if forward_batch is not None else None
        if logits_path is None:
            return original(logits)
        if self.graphs.capturing is not None:
            return self._gather_captured(logits_path, self.graphs.capturing, logits)
        if self.call is not None:
            self._close_unsampled(logits_path)
        rows = logits.shape[0]
        buf = logits_path.logits_buffer(rows)
        buf.copy_(logits)  # the one copy SGLang's own all_gather does not make
        # Every rank decides from the same table and the same batch; begin_call adopts what is due for this call
        # and returns its mode (exchange() and run() below do not repeat it).
        table_mode = logits_path.begin_call(rows)
        vocab = int(processor.vocab_size)  # SGLang pads the LM head; it trims the padding after the gather
        sampled = None
        if not full_logits_everywhere(forward_batch) and self._gatherwise_takes(forward_batch, rows):
            sampled = batch_rows(forward_batch.sampling_info, self._schedule_batch, vocab,
                                 self.config.engine.sampler_seed)
        verdict = sglang_batch(forward_batch, sampled)
        sampler, mode = route(table_mode, verdict)
        if sampler == Sampler.GATHERWISE and sampled is not None:  # gatherwise's sampler, in the table's mode
            # what SGLang does to the logits between the gather and its sampler, on the shard (elementwise)
            _soft_cap(processor, buf)
            if self._sanitize_nan:
                torch.nan_to_num_(buf, nan=-1e30, posinf=1e30, neginf=-1e30)  # SGLang's sanitize_nan_logits
            return self.sample_now(logits_path, mode, sampler, buf, vocab, logits, sampled, verdict.kind)
        if sampler == Sampler.ARGMAX:
            return self.sharded_argmax(logits_path, buf, vocab, logits)
        mode, shards = logits_path.exchange(mode=mode, kind=verdict.kind)
        self.call = OpenCall(mode, sampler, rows, draws=not forward_batch.sampling_info.is_all_greedy)
        return self.engine_logits(logits_path, mode, shards, logits)

    def _gatherwise_takes(self, forward_batch: Any, rows: int) -> bool:
        """Whether gatherwise's sampler draws this call's tokens: not with `engine.sampler: engine`, not for
        all-greedy batches (their own route is exact), not for batches it cannot honour exactly (`refusal`).
        Every rank decides the same from the same batch."""
        if not self.gatherwise_samples or forward_batch.sampling_info.is_all_greedy:
            return False
        why = refusal(forward_batch, self._schedule_batch, getattr(self._worker, "model_runner", None), rows)
        if why is None:
            return True
        if why not in self._refusals and self.logits_path.rank == 0:
            self._refusals.add(why)
            log.info("gatherwise: sampled batches with %s keep SGLang's sampler (engine.sampler: gatherwise takes "
                     "the others)", why)
        return False

    def _gather_captured(self, logits_path: Any, mode: Mode, logits: torch.Tensor) -> torch.Tensor:
        """A decode forward SGLang runs while capturing `mode`'s graphs (its warm-ups, then the capture):
        only the device work of `mode`'s exchange; the host part runs around each replay (replay_decode)."""
        if self._graph_reserve:  # captured graphs pin the path's buffers: size them for every later call now
            logits_path.reserve(self._graph_reserve)
            self._graph_reserve = 0
        rows = logits.shape[0]
        logits_path.logits_buffer(rows).copy_(logits)
        with logits_path.capturing(mode):
            mode, shards = logits_path.exchange()
        self.graphs.note_captured(mode, rows)
        if mode == Mode.ALL_GATHER or logits_path.rank == 0:
            return shards.permute(1, 0, 2).reshape(rows, -1)
        # Fresh, not the cached placeholder: this one lives in the graph's memory pool.
        return torch.zeros(rows, logits_path.world_size * logits_path.width, dtype=logits.dtype, device=logits.device)

    # -- DecodeCudaGraphRunner: capture one graph per mode, pick one per step ---------------------------------
    def _active(self) -> bool:
        return self.installed is not None and self.disabled is None

    def capture_decode_graphs(self, original: Callable, runner: Any, *args: Any, **kwargs: Any) -> Any:
        """Around SGLang's capture loop (`_capture_one_stream`): one pass per mode of `engine.graph_modes`. The
        hooks install in the first pass's first warm-up forward (eager, before any graph is recorded)."""
        if self.disabled is not None or self.graphs.capturing is not None:
            return original(runner, *args, **kwargs)
        model_runner = getattr(runner, "model_runner", None)
        if getattr(model_runner, "is_draft_worker", False):  # speculative decoding: the hooks stay off anyway
            return original(runner, *args, **kwargs)
        capture_bs = list(getattr(runner, "capture_bs", None) or [0])
        self._graph_reserve = max(*capture_bs, int(getattr(model_runner, "max_running_requests", 0) or 0))
        result = None
        for mode in self.graphs.modes:
            with self.graphs.capture_pass(mode):
                result = original(runner, *args, **kwargs)
            if not self._active():  # hooks off, or the gatherer never ran: one plain pass is all SGLang needs
                break
        return result

    def can_replay(self, original: Callable, runner: Any, forward_batch: Any) -> bool:
        """Around `can_run_graph`: whether this step replays a graph, and which mode's. A hooked step replays
        the graph of the mode its table gives (decided here, on the host, identically on every rank); a mode
        without a captured graph (sharded, or one left out of engine.graph_modes) runs the step eagerly."""
        self._replay_mode = None
        if not self.graphs.passes:  # SGLang captured no decode graphs through the hooks
            return original(runner, forward_batch)
        if not self._active():
            with self.graphs.keyed(self.graphs.plain_mode()):
                return original(runner, forward_batch)
        if not (self._in_step and hookable(forward_batch)):
            return False  # a logits call gatherwise does not hook runs eagerly (its graphs all hold the hook)
        if full_logits_everywhere(forward_batch):
            return False  # all_gather forced for that batch: the eager path does it
        rows = int(forward_batch.batch_size)
        if self._gatherwise_takes(forward_batch, rows):
            return False  # gatherwise's sampler runs at the gather, which only the eager path reaches
        mode = self.logits_path.begin_call(rows)  # the eager path asks again for this call: same answer
        if self.graphs.graph_rows(mode, rows) is None:
            return False
        with self.graphs.keyed(mode):
            ok = bool(original(runner, forward_batch))
        self._replay_mode = mode if ok else None
        return ok

    def replay_decode(self, original: Callable, runner: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
        """Around `execute` (load inputs, replay, slice outputs): the replay of the mode can_replay chose, timed
        on the host, then the host part of the call (LogitsPath.finish_replay); the sampler hook completes it."""
        mode, self._replay_mode = self._replay_mode, None
        if mode is None:
            plain = self.graphs.plain_mode() if self.graphs.passes and not self._active() else None
            with self.graphs.keyed(plain):
                return original(runner, forward_batch, *args, **kwargs)
        logits_path = self.logits_path
        self._in_step = False  # this step's logits call is the replayed one
        if self.call is not None:
            self._close_unsampled(logits_path)
        t_start = logits_path.clock()
        with self.graphs.keyed(mode):
            out = original(runner, forward_batch, *args, **kwargs)
        rows = int(runner.bs)  # the captured size SGLang padded the batch to
        logits_path.finish_replay(mode, rows, t_start, logits_path.clock(), call_kind_of(forward_batch))
        self.call = OpenCall(mode, Sampler.ENGINE, rows, draws=not forward_batch.sampling_info.is_all_greedy,
                             real_rows=int(forward_batch.batch_size))
        return out

    def _close_unsampled(self, logits_path: Any) -> None:
        """A hooked call that SGLang never sampled from (not expected): finish it the same way on every rank so
        the next call starts clean."""
        pending = self.take_call()
        if pending is None:  # no hooked call is open
            return
        if pending.tokens is not None:  # finished inside the path already
            return
        zeros = torch.zeros(pending.rows, dtype=torch.int64, device=logits_path.device)
        logits_path.complete(zeros if pending.mode != Mode.ALL_GATHER and logits_path.rank == 0 else None)
        log.warning("gatherwise: a hooked logits call was not followed by sampling; closed it")

    # -- Sampler.forward --------------------------------------------------------------------------------------
    def sample(self, original: Callable, sampler: Any, logits_output: Any, sampling_info: Any, *args: Any,
               **kwargs: Any) -> torch.Tensor:
        call = self.take_call()
        if call is None:
            if self.resync is not None:  # an unhooked call samples on every rank: they must draw alike
                self.resync.before_call(True, not sampling_info.is_all_greedy)
            return original(sampler, logits_output, sampling_info, *args, **kwargs)
        if call.tokens is not None:  # the path sampled it at the gather: no rank draws from its generator
            return call.tokens.to(sampled_ids_dtype(sampling_info))
        self.resync.before_call(call.mode == Mode.ALL_GATHER, call.draws)

        def sample_here() -> torch.Tensor:
            self.root_samples_alone = call.mode != Mode.ALL_GATHER
            try:
                return original(sampler, logits_output, sampling_info, *args, **kwargs)
            finally:
                self.root_samples_alone = False

        ids = self.finish_around_sampler(call, sample_here, lambda ids: _padded(ids.view(-1), call))
        if ids is not None:
            return ids
        assert call.tokens is not None
        ids = call.tokens[: call.real_rows or call.rows].to(sampled_ids_dtype(sampling_info))
        return_logprob = kwargs.get("return_logprob", args[0] if args else False)
        if return_logprob:
            self._placeholder_logprobs(sampler, logits_output, ids, *args, **kwargs)
        return ids

    @staticmethod
    def _placeholder_logprobs(sampler: Any, logits_output: Any, ids: torch.Tensor, *args: Any,
                              **kwargs: Any) -> None:
        """Logprob outputs of the shapes rank 0 computes (values are the placeholder logits': never sent)."""
        names = ("return_logprob", "top_logprobs_nums", "token_ids_logprobs")
        given = dict(zip(names, args, strict=False)) | {k: kwargs[k] for k in names if k in kwargs}
        result = sampler.output_logprob_processor.compute_logprobs(
            logits_output.next_token_logits, given["top_logprobs_nums"], given["token_ids_logprobs"], ids)
        result.write_output_to(logits_output)
