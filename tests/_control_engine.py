"""A real TP engine loop for control tests: gloo ranks (tests._dist.run_ranks) + install_hooks + fixed logits.

Every call's logits come from a generator seeded by the call index (identical on every rank, and in every run),
each rank writes its own vocab shard, and LogitsPath samples (greedy and seeded temperature rows). Each rank
returns its mode log and tokens, so a test can check that ranks agree on every call and that tokens do not
depend on the switch schedule. Rank 0 stops the loop (for every rank, at the same call) when `stop_file` exists.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tests._dist import run_ranks

if TYPE_CHECKING:
    import torch

CHECK_EVERY = 8


@dataclass(frozen=True)
class LoopSpec:
    config_path: str | None
    stop_file: str
    rows_cycle: tuple[int, ...] = (1, 2, 3, 5, 8, 13)
    vocab: int = 1000
    pace_seconds: float = 0.001  # sleep between calls: leaves CPU to the sidecar and other tests
    max_calls: int | None = None  # stop after this many calls (a reference run) instead of on the stop file
    control: bool = True
    # (mode label, seconds) pairs: sleep this long after a call that ran that mode, outside the logits path.
    # Stands in for a mode that lengthens the rest of the engine's step (the path's records do not show it).
    rest_of_step: tuple[tuple[str, float], ...] = ()


@dataclass
class RankResult:
    rank: int
    engine_id: int
    modes: list[int]
    tokens: list[list[int]]
    control_disabled: bool | None = None
    ignored_commands: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def logits_for(call: int, rows: int, vocab: int) -> torch.Tensor:
    import torch

    gen = torch.Generator().manual_seed(1_000_003 * call + 17)
    return torch.randn(rows, vocab, generator=gen)


def rows_for(spec: LoopSpec, call: int) -> int:
    return spec.rows_cycle[call % len(spec.rows_cycle)]


def loop_rank(rank: int, world: int, spec: LoopSpec) -> RankResult:
    import torch

    from gatherwise.config import load_config
    from gatherwise.engine_hooks.comm import default_communicator
    from gatherwise.engine_hooks.control_block import ControlBlockSource
    from gatherwise.engine_hooks.install import install_hooks
    from gatherwise.engine_hooks.logged_path import LoggedLogitsPath
    from gatherwise.engine_hooks.sampling import SamplingParams, SamplingRow
    from gatherwise.modes import LABEL_OF_CODE
    from gatherwise.tp_engine.decode_load import stop_on_every_rank

    cfg = load_config(spec.config_path)
    if not spec.control:
        cfg = cfg.replace(control=cfg.control.replace(enabled=False), telemetry=cfg.telemetry.replace(enabled=False))
    comm = default_communicator()
    hooks = install_hooks(comm, vocab=spec.vocab, config=cfg, keep_log=True)
    path = hooks.logits_path
    assert isinstance(path, LoggedLogitsPath)  # keep_log=True
    width = path.width
    lo, hi = rank * width, min(spec.vocab, (rank + 1) * width)
    greedy, seeded = SamplingParams(), SamplingParams(temperature=0.8, top_k=50, seed=11)
    flag = torch.zeros(1, dtype=torch.int64)
    tokens: list[list[int]] = []
    call = 0

    def finished() -> bool:  # rank 0's view: the test asked to stop, or the planned calls ran
        return os.path.exists(spec.stop_file) if spec.max_calls is None else call >= spec.max_calls

    try:
        while True:
            rows = rows_for(spec, call)
            full = logits_for(call, rows, spec.vocab)
            buf = path.logits_buffer(rows)
            buf[:, : hi - lo] = full[:, lo:hi]
            batch = [SamplingRow(seeded if r % 2 else greedy, request_id=r, position=call) for r in range(rows)]
            tokens.append(path.run(batch).tolist())
            call += 1
            if spec.rest_of_step:
                time.sleep(dict(spec.rest_of_step).get(LABEL_OF_CODE[path.mode_log[-1]], 0.0))
            if spec.pace_seconds:
                time.sleep(spec.pace_seconds)
            if call % CHECK_EVERY == 0 and stop_on_every_rank(comm, flag, finished):
                break
        source = next((c for c in hooks._closables if isinstance(c, ControlBlockSource)), None)
        return RankResult(rank, hooks.engine_id, [int(m) for m in path.mode_log], tokens,
                          None if source is None else source.disabled,
                          None if source is None else source.ignored_commands)
    finally:
        hooks.close()


class BackgroundEngine:
    """Run the TP loop in a thread (run_ranks blocks) so the test can drive the sidecar meanwhile."""

    def __init__(self, spec: LoopSpec, world: int = 2, timeout: float = 240.0) -> None:
        self.spec = spec
        self.results: list[RankResult] | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(world, timeout), daemon=True)
        self._thread.start()

    def _run(self, world: int, timeout: float) -> None:
        try:
            self.results = run_ranks(loop_rank, world, self.spec, timeout=timeout)
        except BaseException as exc:
            self.error = exc

    def stop(self, timeout: float = 120.0) -> list[RankResult]:
        with open(self.spec.stop_file, "w"):
            pass
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"engine did not stop within {timeout}s (deadlock?)")
        if self.error is not None:
            raise self.error
        assert self.results is not None  # the thread ended without an error: run_ranks returned
        return self.results


def reference_tokens(spec: LoopSpec, calls: int, world: int = 2) -> list[list[int]]:
    """Tokens of a run with no control at all (the initial table throughout) for the same calls."""
    ref = LoopSpec(spec.config_path, spec.stop_file + ".ref", spec.rows_cycle, spec.vocab, 0.0,
                   max_calls=calls, control=False)
    results = run_ranks(loop_rank, world, ref, timeout=240)
    return results[0].tokens[:calls]
