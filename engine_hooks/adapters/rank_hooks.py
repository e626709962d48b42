"""What the step hooks of every engine adapter do alike in one TP rank: install the hooks at the first hooked
logits call, carry the open call from the gather to the sampler, hand the engine's sampler the logits layout its
own all_gather gives, take the tokens gatherwise samples at the gather (sharded argmax, gatherwise's sampler),
and finish a call around the engine's own sampler. Each engine's step hooks build on one RankHooks per rank.
"""

from __future__ import annotations

import atexit
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from gatherwise.call_kind import Sampling, call_kind
from gatherwise.config import GatherwiseConfig
from gatherwise.engine_hooks.adapters.batch_verdict import Sampler
from gatherwise.engine_hooks.adapters.open_call import OpenCall
from gatherwise.engine_hooks.adapters.placeholder_logits import PlaceholderLogits
from gatherwise.engine_hooks.adapters.sampler_rows import gatherwise_samples, sampler_labels
from gatherwise.engine_hooks.logits_path import LogitsPath, shard_width
from gatherwise.engine_hooks.sampling_params import SamplingParams, SamplingRow
from gatherwise.modes import Mode
from gatherwise.shm_format.engine_info import RankRoute
from gatherwise.shm_format.ring import engine_dir_name

if TYPE_CHECKING:
    from gatherwise.engine_hooks.fingerprints.engines import InstallCheck
    from gatherwise.engine_hooks.install import InstalledHooks

GREEDY = call_kind(Sampling.GREEDY)
SamplerOutput = TypeVar("SamplerOutput")


def shard_shape_problem(logits: torch.Tensor) -> str | None:
    """Why the engine's logits shard cannot go through the path as is, or None: the path needs a [rows, width]
    shard whose width is already padded the way the path pads it (shard_width), so that P shards are the
    engine's padded vocab."""
    if logits.dim() != 2 or logits.shape[-1] != shard_width(logits.shape[-1], 1):
        return f"unexpected logits shard shape {tuple(logits.shape)}"
    return None


def mask_padding(logits_path: LogitsPath, buf: torch.Tensor, real_vocab: int | None) -> None:
    """Columns past `real_vocab` are the engine's LM-head padding, which it trims after its own gather:
    gatherwise's sampler must never draw them."""
    if real_vocab is not None:
        buf[:, max(0, min(logits_path.width, real_vocab - logits_path.rank * logits_path.width)):] = float("-inf")


class RankHooks:
    ENGINE = "engine"  # the engine's name, as its hooks-off notices spell it
    DISTRIBUTION = ""  # the engine's package, whose version the rank info file names

    def engine_version(self) -> str:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version(self.DISTRIBUTION) if self.DISTRIBUTION else "unknown"
        except PackageNotFoundError:  # an engine run from its source tree
            return "unknown"

    def __init__(self, config: GatherwiseConfig, log: logging.Logger, check: InstallCheck | None = None) -> None:
        self.config, self.log = config, log
        self.check = check  # the engine's fingerprint check (None: hooks built without one, as in tests)
        self.runner_kind: str | None = None  # the fingerprinted runner this rank runs ("v1", "v2", "sglang")
        self.runner_class = ""  # the engine's runner class on this rank, module and name
        self.installed: InstalledHooks | None = None  # once the first hooked call ran
        self.disabled: str | None = None  # why the hooks stay off in this rank
        self.call: OpenCall | None = None  # the hooked call whose sampler call is still to come
        self._greedy_rows: list[SamplingRow] = []  # reused for every sharded greedy call
        self._placeholder = PlaceholderLogits()

    def _install(self, comm: Any, logits: torch.Tensor) -> LogitsPath:
        """Handshake, engine id, ring recorder and control block for this rank (every rank calls it at the same
        hooked call); returns the path."""
        from gatherwise.engine_hooks.install import install_hooks

        sampler = self.sampler_labels()
        self.installed = install_hooks(comm, vocab=logits.shape[-1] * comm.world_size, dtype=logits.dtype,
                                       device=logits.device, config=self.config, engine_kind=self.ENGINE,
                                       engine_version=self.engine_version(), sampler=sampler,
                                       model=self.model_name(), route=self.route())
        atexit.register(self.close)
        self.log.info("gatherwise: hooks installed on TP rank %d/%d, engine %s, table %s", comm.rank,
                      comm.world_size, engine_dir_name(self.installed.engine_id),
                      self.installed.logits_path.table.as_labels())
        return self.installed.logits_path

    def model_name(self) -> str:
        """The model the engine serves, for the rank info file; "" where the engine does not tell."""
        return ""

    def route(self) -> RankRoute:
        """Which runner and logits route run on this rank, and what its fingerprints matched (the rank info file,
        `/v1/engine`, the page)."""
        engagement = None if self.check is None or self.runner_kind is None else self.check.engagement(self.runner_kind)
        if engagement is None:
            return RankRoute(self.runner_class)
        return RankRoute(self.runner_class, engagement.runner.description, engagement.matched_text())

    def see_runner(self, runner: object, kind: str) -> None:
        """Note the runner this rank runs, as the fingerprinted runner `kind`."""
        self.runner_kind = kind
        self.runner_class = f"{type(runner).__module__}.{type(runner).__qualname__}"

    def sampler_labels(self) -> dict[str, str]:
        """Who samples in each mode (the rank info file, `/v1/live`, the page)."""
        return sampler_labels(self.ENGINE, self.samples_with_gatherwise())

    def samples_with_gatherwise(self) -> bool:
        """Whether gatherwise's own sampler takes this engine's sampled batches (engine.sampler: gatherwise)."""
        return gatherwise_samples(self.config)

    @property
    def logits_path(self) -> LogitsPath:
        """The installed path: only for hooked calls, which run after _install."""
        assert self.installed is not None, "a hooked call before the hooks were installed"
        return self.installed.logits_path

    def close(self) -> None:
        if self.installed is not None:
            self.installed.close()
            self.installed = None

    def placeholder_logits(self, logits_path: LogitsPath, logits: torch.Tensor) -> torch.Tensor:
        """Full-vocab logits for a rank that does not sample this call."""
        return self._placeholder.get(logits.shape[0], logits_path.world_size * logits_path.width, logits.dtype,
                                     logits.device)

    def engine_logits(self, logits_path: LogitsPath, mode: Mode, shards: torch.Tensor,
                      logits: torch.Tensor) -> torch.Tensor:
        """What the hooked collective returns to the engine: on a rank that samples, [B, P*Vs] as the engine's
        own all_gather lays it out; elsewhere placeholder logits."""
        if mode == Mode.ALL_GATHER or logits_path.rank == 0:
            return shards.permute(1, 0, 2).reshape(logits.shape[0], -1)
        return self.placeholder_logits(logits_path, logits)

    def take_call(self) -> OpenCall | None:
        """The open call, now closed: the sampler hook finishes it (None: the sampler call is not a hooked one)."""
        call, self.call = self.call, None
        return call

    def sharded_argmax(self, logits_path: LogitsPath, buf: torch.Tensor, real_vocab: int | None,
                       logits: torch.Tensor) -> torch.Tensor:
        """A sharded greedy call now (see sample_now)."""
        rows = logits.shape[0]
        if len(self._greedy_rows) < rows:
            self._greedy_rows = [SamplingRow(SamplingParams(), request_id=i, position=0) for i in range(rows)]
        return self.sample_now(logits_path, Mode.SHARDED, Sampler.ARGMAX, buf, real_vocab, logits,
                               self._greedy_rows[:rows], GREEDY)

    def sample_now(self, logits_path: LogitsPath, mode: Mode, sampler: Sampler, buf: torch.Tensor,
                   real_vocab: int | None, logits: torch.Tensor, rows: list[SamplingRow],
                   kind: int | None) -> torch.Tensor:
        """gatherwise samples this call now, in the mode the table gives: every rank gets the tokens (the open
        call carries them to the sampler hook), the engine gets placeholder logits to pass along (mask_padding)."""
        mask_padding(logits_path, buf, real_vocab)
        self.call = OpenCall(mode, sampler, len(rows), tokens=logits_path.run(rows, kind))
        return self.placeholder_logits(logits_path, logits)

    def finish_around_sampler(self, call: OpenCall, sample: Callable[[], SamplerOutput],
                              ids: Callable[[SamplerOutput], torch.Tensor]) -> SamplerOutput | None:
        """Finish `call` around the engine's own sampler: where this rank samples (every rank in all_gather,
        rank 0 in gather) `sample` runs, timed, and its `ids` go to the other ranks; its output is returned.
        A rank that skips the sampler gets None, and rank 0's tokens in `call.tokens`."""
        assert call.mode != Mode.SHARDED, "a sharded call is sampled at the logits call or on the shards"
        logits_path = self.logits_path
        clock = getattr(logits_path, "clock", time.perf_counter_ns)
        if call.mode == Mode.ALL_GATHER or logits_path.rank == 0:
            start = clock()
            out = sample()
            end = clock()
            logits_path.complete(ids(out) if call.mode != Mode.ALL_GATHER else None, sample_start=start,
                                 sample_end=end)
            return out
        call.tokens = logits_path.complete(None)
        assert call.tokens is not None, "a rank that did not sample gets the tokens from the path"
        return None
