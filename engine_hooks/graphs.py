"""CUDA graphs and the logits path: one captured variant per mode, the mode chosen on the host before replay.

A graph replays the device work it captured and nothing else: no Python runs inside it, so it cannot pick a
mode or read a control word. What gatherwise needs per call on the host is split out (LogitsPath.begin_call and
finish_replay) and runs around the replay:

    graphs = ModeGraphs(path)                    # once, after install_hooks()
    path.reserve(max_rows)                       # captured graphs pin the path's buffers
    for mode in CAPTURABLE:                      # at capture time, per batch size the engine graphs
        for rows in (1, 2, 4, 8):
            graphs.capture(mode, rows, lambda: step(rows))   # step() fills path.logits_buffer(rows), calls the path
    ...
    mode, out = graphs.replay(rows)              # every decode step: begin (mode from the table), replay, finish

`replay()` = `begin(rows)` → this call's mode, from the table every rank holds (the control word adopted two
calls after it arrived, gatherwise.engine_hooks.deferred_word, so it is on the host by now without a synchronization) →
replay of that variant → `end()`. Every rank picks the same variant because every rank holds the same table.

What the captured function may contain: a whole call (`path.run()`, or `exchange()` + `complete()`), or only
`exchange()` (SGLang captures the model forward including the logits gather but samples outside the graph):
then `end()` leaves the call open and the engine finishes it with `path.complete(...)` after the replay,
exactly as after an eager `exchange()`.

Engines that manage their own graph objects (one per batch size and mode) use `begin(rows)` to learn which
variant to replay and `end()` after replaying it; `capture()` is then only a convenience.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from gatherwise.engine_hooks.logits_path import LogitsPath
from gatherwise.modes import CAPTURABLE, IMPLEMENTED, Mode

T = TypeVar("T")


class Graph(Protocol):
    """The part of torch.cuda.CUDAGraph used here."""

    def replay(self) -> None: ...


class GraphBackend(Protocol):
    def capture(self, fn: Callable[[], Any]) -> tuple[Graph, Any]:
        """Run fn under capture; return the graph and fn's outputs (static: every replay rewrites them)."""


class CudaGraphBackend:
    """torch.cuda graphs: warm-up on a side stream (what torch recommends before capture), then capture."""

    def __init__(self, pool: Any = None, warmup: int = 1) -> None:
        import torch

        self.pool = pool if pool is not None else torch.cuda.graph_pool_handle()  # variants share memory
        self.warmup = warmup

    def capture(self, fn: Callable[[], Any]) -> tuple[Graph, Any]:
        import torch

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn()
        return graph, out


class ModeGraphs:
    """Captured variants of the logits path keyed by (mode, rows); the host picks one per call before replay."""

    def __init__(self, logits_path: LogitsPath, backend: GraphBackend | None = None) -> None:
        self.logits_path = logits_path
        self._backend = backend
        self._variants: dict[tuple[Mode, int], tuple[Graph, Any]] = {}
        self._open: tuple[Mode, int, int] | None = None  # (mode, rows, t_start) between begin() and end()

    @property
    def backend(self) -> GraphBackend:
        if self._backend is None:
            self._backend = CudaGraphBackend()
        return self._backend

    def capture(self, mode: Mode, rows: int, fn: Callable[[], T]) -> T:
        """Capture fn as the `mode` variant for `rows` rows; returns its (static) outputs.

        fn fills `path.logits_buffer(rows)` and runs the path once (run(), or exchange() with or without
        complete()); while it is captured the path enqueues device work only, in `mode`."""
        mode = Mode(mode)
        if mode not in IMPLEMENTED:
            raise ValueError(f"mode {mode.label!r} is not implemented")
        if mode not in CAPTURABLE:
            raise ValueError(f"mode {mode.label!r} cannot be captured in a CUDA graph: it samples with host-side "
                             "decisions; run its calls eagerly with path.run()")
        if self._open is not None:
            raise RuntimeError("capture() between begin() and end()")
        logits_path = self.logits_path

        def device_part() -> T:
            with logits_path.capturing(mode):
                return fn()

        self._variants[(mode, rows)] = self.backend.capture(device_part)
        return self._variants[(mode, rows)][1]

    def captured(self) -> set[tuple[Mode, int]]:
        return set(self._variants)

    def begin(self, rows: int) -> Mode:
        """Host part before the replay: adopt what is due, rank 0 reads its table source; returns the mode
        whose variant to replay (the same on every rank)."""
        if self._open is not None:
            raise RuntimeError("begin() twice without end()")
        t_start = self.logits_path.clock()
        mode = self.logits_path.begin_call(rows)
        self._open = (mode, rows, t_start)
        return mode

    def end(self) -> None:
        """Host part after the replay: stash the received control word, record the call (or leave it open for
        complete() when only exchange() was captured)."""
        if self._open is None:
            raise RuntimeError("end() without begin()")
        mode, rows, t_start = self._open
        self._open = None
        self.logits_path.finish_replay(mode, rows, t_start, self.logits_path.clock())

    def replay(self, rows: int) -> tuple[Mode, Any]:
        """One call: choose the variant on the host, replay it, finish the host part; returns (mode, outputs)."""
        mode = self.begin(rows)
        variant = self._variants.get((mode, rows))
        if variant is None:
            self._open = None
            if mode not in CAPTURABLE:
                raise KeyError(f"mode {mode.label} is not captured in graphs: run this call eagerly with path.run()")
            raise KeyError(f"no captured variant for mode {mode.label} with {rows} rows: capture every mode the "
                           f"table can select (captured: {sorted((m.label, r) for m, r in self._variants)})")
        graph, out = variant
        graph.replay()
        self.end()
        return mode, out
