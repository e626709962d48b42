"""What one vLLM worker (one TP rank) holds for both of vLLM's model runners: the hooks' installation at the
first hooked logits call, the refusals, the watch over logits calls outside a step, and which runner's step
hooks (vllm.v1_step, vllm.v2_step) own the logits call now.

The hooks are installed lazily at the first hooked call (torch.distributed and vLLM's TP group exist by then):
handshake, engine id, ring recorder and control block come from gatherwise.engine_hooks.install.install_hooks.
"""

from __future__ import annotations

import logging
import multiprocessing.util
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

import torch

from gatherwise.config import GatherwiseConfig
from gatherwise.engine_hooks.adapters.hooks_off import report_hooks_off
from gatherwise.engine_hooks.adapters.rank_hooks import RankHooks, shard_shape_problem
from gatherwise.engine_hooks.adapters.sampler_rows import gatherwise_samples
from gatherwise.engine_hooks.adapters.vllm.runner_kind import runner_kind
from gatherwise.engine_hooks.adapters.vllm.tp_group import tp_rank, tp_world_size
from gatherwise.engine_hooks.logits_path import LogitsPath

if TYPE_CHECKING:
    from gatherwise.engine_hooks.fingerprints.engines import InstallCheck

log = logging.getLogger("gatherwise.vllm")
_FINALIZE_PRIORITY = 10  # multiprocessing runs finalizers that have an exit priority when a worker exits, highest first


class StepHooks(Protocol):
    """A model runner's hooks for the logits call of its step."""

    def gather_logits(self, processor: Any, logits: torch.Tensor, original: Callable) -> torch.Tensor: ...


class VllmWorker(RankHooks):
    ENGINE = "vLLM"
    DISTRIBUTION = "vllm"

    def __init__(self, config: GatherwiseConfig, check: InstallCheck | None = None) -> None:
        super().__init__(config, log, check)
        self.runner: Any = None  # the model runner inside its step, else None
        self.step_hooks: StepHooks | None = None  # the hooks of the runner inside its step, else None
        self.runner_labels: dict[str, str] | None = None  # who samples in each mode, where the runner says
        self.resync: Any = None  # gatherwise.engine_hooks.rng_resync.RandomStateResync, with the hooks
        self.gatherwise_samples = gatherwise_samples(config)  # engine.sampler: gatherwise
        self._unhooked_depth = 0  # inside one of vLLM's own logits calls outside a step (warm-up, prompt logprobs)
        self._unhooked_reported = False  # a logits gather outside every hooked step was reported
        self._said: set[str] = set()  # why batches stepped aside (each said once)

    def model_name(self) -> str:
        """The served model name (vLLM's --served-model-name, else the model it loaded), read from the runner of
        the step that installs the hooks."""
        model_config = getattr(self.runner, "model_config", None)
        name = getattr(model_config, "served_model_name", None)
        name = name[0] if isinstance(name, (list, tuple)) and name else name
        name = name if isinstance(name, str) and name else getattr(model_config, "model", "")
        return name if isinstance(name, str) else ""

    def samples_with_gatherwise(self) -> bool:
        return self.gatherwise_samples

    def sampler_labels(self) -> dict[str, str]:
        return self.runner_labels or super().sampler_labels()

    @contextmanager
    def step(self, runner: Any, hooks: StepHooks) -> Iterator[None]:
        """The scope of one runner step whose logits call `hooks` take."""
        self.runner, self.step_hooks = runner, hooks
        try:
            yield
        finally:
            self.runner = self.step_hooks = None

    @contextmanager
    def unhooked_scope(self) -> Iterator[None]:
        self._unhooked_depth += 1
        try:
            yield
        finally:
            self._unhooked_depth -= 1

    # -- LogitsProcessor._gather_logits ---------------------------------------------------------------------
    def gather_logits(self, processor: Any, logits: torch.Tensor, original: Callable) -> torch.Tensor:
        hooks = self.step_hooks
        if hooks is None:
            if self._unhooked_depth == 0 and self.disabled is None and not self._unhooked_reported:
                self._report_unhooked_call()
            return original(processor, logits)
        return hooks.gather_logits(processor, logits, original)

    def _report_unhooked_call(self) -> None:
        self._unhooked_reported = True  # said once: later such calls cost nothing more than vLLM's own
        caller = _runner_frame_name()
        engaged = "" if self.installed is None else " (the hooks are installed, but this call bypasses them)"
        unhooked = "" if self.check is None else "".join(
            f"; the install has {e.runner.description}, which gatherwise does not hook"
            for e in self.check.engagements if not e.runner.hooked)
        report_hooks_off(log, "vLLM", "unhooked_logits_calls",
                         f"vLLM's logits gather ran outside a hooked step, called from {caller}{engaged}; gatherwise "
                         f"neither times nor switches such calls (vLLM's own all_gather runs){unhooked}", self.config,
                         tp_rank())

    # -- installation and refusals ------------------------------------------------------------------------------
    def refused_runner(self, runner: Any) -> bool:
        """Hooks off (said once) unless `runner` is a runner the hooks take and its fingerprints engaged: never
        run blind on a runner or a release nobody read. Decided at the worker's first step, alike on every rank."""
        if self.runner_kind is not None:
            return False
        kind = runner_kind(runner)
        if kind is None:
            cls = type(runner)
            self.disable("unsupported_feature", f"the model runner {cls.__module__}.{cls.__qualname__} is neither "
                         "of vLLM's runners gatherwise hooks (V1's or Model Runner V2's GPUModelRunner)", tp_rank())
            return True
        self.see_runner(runner, kind)
        refusal = None if self.check is None else self.check.runner_refusal(kind)
        if refusal is not None:
            self.disable("unsupported_version", refusal, tp_rank())
            return True
        return False

    def refused_single_rank(self) -> bool:
        """Hooks off (said once) in a TP=1 worker: vLLM makes no logits collective there."""
        if tp_world_size() != 1:
            return False
        self.disable("single_rank", "TP=1: vLLM makes no logits collective, so there is nothing to hook", 0)
        return True

    def say_once(self, reason: str, message: str) -> None:
        """Log `message` (its %s is the reason) on TP rank 0, once per reason a batch stepped aside for."""
        if reason not in self._said:
            self._said.add(reason)
            if tp_rank() == 0:
                log.info(message, reason)

    def disable(self, reason: str, why: str, rank: int | None = None) -> None:
        self.disabled = why
        report_hooks_off(log, "vLLM", reason, f"hooks stay off in this vLLM worker: {why}; vLLM's own logits path "
                         "runs", self.config, rank)

    def path(self, logits: torch.Tensor) -> LogitsPath | None:
        """The logits path of this step's call, installed at the first one; None where the hooks stay off."""
        if self.installed is not None:
            return self.logits_path
        if self.disabled is not None:
            return None
        # Every rank reaches the same decision here from the same config, so no rank waits alone.
        from vllm.distributed.parallel_state import get_pp_group, get_tp_group

        rank = get_tp_group().rank_in_group
        if getattr(self.runner, "speculative_config", None) is not None:
            self.disable("unsupported_feature", "speculative decoding is not supported", rank)
            return None
        if get_pp_group().world_size > 1:
            self.disable("unsupported_feature", "pipeline parallelism is not supported", rank)
            return None
        problem = shard_shape_problem(logits)
        if problem:
            self.disable("logits_shape", problem, rank)
            return None
        from gatherwise.engine_hooks.adapters.vllm.comm import VllmGroupCommunicator
        from gatherwise.engine_hooks.rng_resync import RandomStateResync

        comm = VllmGroupCommunicator(get_tp_group())
        logits_path = self._install(comm, logits)
        self.resync = RandomStateResync(comm, logits.device)
        # a forked vLLM worker ends through multiprocessing, which skips atexit but runs its finalizers
        multiprocessing.util.Finalize(None, self.close, exitpriority=_FINALIZE_PRIORITY)
        return logits_path


def _runner_frame_name() -> str:
    """Who called the logits gather: the nearest caller outside vLLM's model and layers (the runner's method)."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if not module.startswith(("vllm.model_executor", "torch", "gatherwise.engine_hooks")):
            return f"{module}.{getattr(frame.f_code, 'co_qualname', frame.f_code.co_name)}"  # 3.10 has no co_qualname
        frame = frame.f_back
    return "an unknown caller"
