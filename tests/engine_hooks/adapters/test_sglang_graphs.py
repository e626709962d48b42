"""Per-mode decode CUDA graphs in the SGLang adapter, on CPU: capture passes, graph keys, the mode chosen on the
host before replay, eager steps for modes without a graph, and the host part of each replayed call.

No GPU and no SGLang needed: StandInDecodeGraphRunner stands in for SGLang 0.5.23's DecodeCudaGraphRunner (the
structure the patches rely on: a capture loop over batch sizes that keys each graph with `_make_graph_key`,
`can_run_graph` padding a batch up to a captured size, `execute` loading the batch, replaying the keyed graph
and slicing the outputs), and StandInGraph stands in for a CUDA graph: its replay re-runs the captured forward
with the path in capture mode (device work only, exactly what a CUDA graph replays) into the static output. The
wrappers driven are the ones sglang.patches registers with SGLang; the hooks, the path and the collectives are
real (two gloo ranks). The same patches in a real SGLang engine with CUDA graphs need a GPU (docs/sglang.md).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING

import pytest
import torch

from tests._dist import run_ranks

if TYPE_CHECKING:
    from gatherwise.engine_hooks.adapters.sglang.graphs import DecodeGraphModes
    from gatherwise.engine_hooks.adapters.sglang.step import SglangStepHooks
    from gatherwise.engine_hooks.comm import Communicator
    from gatherwise.engine_hooks.table_source import InProcessTableSource
    from gatherwise.modes import Mode

VOCAB = 16
CAPTURE_BS = [1, 2, 4]


def _full_logits(step: int, rows: int) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(500 + step))


def _batch(rows: int) -> SimpleNamespace:
    """What the hooks read of an SGLang decode ForwardBatch (greedy, no logprobs)."""
    info = SimpleNamespace(is_all_greedy=True, penalizer_orchestrator=None, has_custom_logit_processor=False)
    return SimpleNamespace(forward_mode=SimpleNamespace(name="DECODE"), sampling_info=info, batch_size=rows,
                           return_logprob=False, is_prefill_only=False)


class StandInGraph:
    """Stands in for a CUDA graph: replay re-runs the captured forward in the captured mode into the output."""

    def __init__(self, graphs: DecodeGraphModes, mode: Mode | None, fn: Callable[[], torch.Tensor],
                 out: torch.Tensor) -> None:
        self.graphs, self.mode, self.fn, self.out = graphs, mode, fn, out

    def replay(self) -> None:
        saved, self.graphs.capturing = self.graphs.capturing, self.mode
        try:
            self.out.copy_(self.fn())
        finally:
            self.graphs.capturing = saved


class StandInDecodeGraphRunner:
    """Stands in for SGLang's DecodeCudaGraphRunner and the model forward it captures (LM head shard, then
    LogitsProcessor.forward with its hooked gatherer). Public methods go through the registered wrappers."""

    def __init__(self, hooks: SglangStepHooks, wrapped: dict, rank: int, world: int) -> None:
        self.hooks, self.wrapped, self.rank, self.world = hooks, wrapped, rank, world
        self.capture_bs = CAPTURE_BS
        self.model_runner = SimpleNamespace(is_draft_worker=False, max_running_requests=6)
        self.static_logits = {bs: torch.zeros(bs, VOCAB) for bs in CAPTURE_BS}  # the graphs' static inputs
        self.graphs: dict = {}
        self.bs = 0
        self.replayed: list = []  # keys of the graphs execute() replayed
        self.processor = SimpleNamespace(vocab_size=VOCAB)
        from gatherwise.engine_hooks.adapters.sglang.patches import _HookedGatherer

        self.gatherer = _HookedGatherer(self._all_gather, self.processor, hooks)

    def _all_gather(self, shard):  # SGLang's tensor_model_parallel_all_gather of the logits shards
        parts = [torch.empty_like(shard) for _ in range(self.world)]
        torch.distributed.all_gather(parts, shard.contiguous())
        return torch.cat(parts, dim=-1)

    def forward(self, logits, forward_batch):  # the part of the model forward that gatherwise hooks
        width = VOCAB // self.world
        shard = logits[:, self.rank * width: (self.rank + 1) * width]
        return self.wrapped["forward"](lambda _p, _b: self.gatherer(shard), self.processor, forward_batch)

    # -- SGLang's methods, unpatched ------------------------------------------------------------------------
    def _raw_make_graph_key(self, size, stream_idx=None, variant_label=None, attention_variant=None):
        return (size, stream_idx, variant_label, attention_variant)

    def _raw_capture_one_stream(self, stream_idx=None):
        for bs in reversed(self.capture_bs):
            key = self.make_graph_key(bs, stream_idx)
            batch = _batch(bs)
            for _ in range(2):  # SGLang's warm-up forwards
                self.forward(self.static_logits[bs], batch)
            out = self.forward(self.static_logits[bs], batch)  # the captured forward
            fn = (lambda bs=bs, batch=batch: self.forward(self.static_logits[bs], batch))
            self.graphs[key] = StandInGraph(self.hooks.graphs, self.hooks.graphs.capturing, fn, out)

    def _raw_can_run_graph(self, forward_batch):
        return forward_batch.batch_size <= max(self.capture_bs)

    def _raw_execute(self, forward_batch, pp_proxy_tensors=None):
        rows = forward_batch.batch_size
        self.bs = self.capture_bs[bisect.bisect_left(self.capture_bs, rows)]
        self.static_logits[self.bs].zero_()
        self.static_logits[self.bs][:rows] = forward_batch.logits
        key = self.make_graph_key(self.bs)
        self.replayed.append(key)
        graph = self.graphs[key]
        graph.replay()
        return graph.out[:rows]

    # -- the same methods, patched as SGLang's hook registry does ----------------------------------------------
    def make_graph_key(self, size, stream_idx=None, variant_label=None, attention_variant=None):
        return self.wrapped["key"](type(self)._raw_make_graph_key, self, size, stream_idx, variant_label,
                                   attention_variant)

    def capture(self):
        return self.wrapped["capture"](type(self)._raw_capture_one_stream, self, None)

    def can_run_graph(self, forward_batch):
        return self.wrapped["can_run"](type(self)._raw_can_run_graph, self, forward_batch)

    def execute(self, forward_batch):
        return self.wrapped["execute"](type(self)._raw_execute, self, forward_batch, None)


def _wrapped(hooks: SglangStepHooks) -> dict:
    from gatherwise.engine_hooks.adapters.sglang import patches as p

    by_target = {target: fn for target, fn, _ in p.wrappers(hooks)}
    return {"key": by_target[p.GRAPH_KEY], "capture": by_target[p.GRAPH_CAPTURE],
            "can_run": by_target[p.GRAPH_CAN_RUN], "execute": by_target[p.GRAPH_EXECUTE],
            "forward": lambda original, processor, batch: _logits_forward(hooks, original, processor, batch),
            "step": by_target[p.TP_WORKER_FORWARD], "sample": by_target[p.SAMPLER_FORWARD]}


def _logits_forward(hooks, original, processor, batch):
    with hooks.logits_call(processor, batch):
        return original(processor, batch)


def _hooks(comm: Communicator, graph_modes: str,
           installed: bool = True) -> tuple[SglangStepHooks, InProcessTableSource | None]:
    from gatherwise.config import EngineSection, GatherwiseConfig
    from gatherwise.engine_hooks.adapters.sglang.step import SglangStepHooks
    from gatherwise.engine_hooks.install import InstalledHooks
    from gatherwise.engine_hooks.logged_path import LoggedLogitsPath
    from gatherwise.engine_hooks.rng_resync import RandomStateResync
    from gatherwise.engine_hooks.table_source import InProcessTableSource
    from gatherwise.modes import Mode, ModeTable

    hooks = SglangStepHooks(GatherwiseConfig(engine=EngineSection(graph_modes=graph_modes)))
    source = InProcessTableSource() if comm.rank == 0 else None
    if installed:  # what _path installs at the first hooked call (it needs SGLang's TP group)
        path = LoggedLogitsPath(comm, VOCAB, initial_table=ModeTable.uniform(Mode.ALL_GATHER), table_source=source)
        hooks.installed = InstalledHooks(path, engine_id=0, engine_dir=None, config=hooks.config)
        hooks.resync = RandomStateResync(comm, "cpu")
    return hooks, source


def _sampler(_sampler, logits_output, sampling_info, *args, **kwargs):  # SGLang's greedy sampler
    return logits_output.next_token_logits[:, :VOCAB].argmax(-1)


def _serve(rank, world, graph_modes, schedule):
    """Capture, then decode steps of `schedule` [(rows, table requested before the step or None)]; returns what
    every step did and gave."""
    from gatherwise.engine_hooks.comm import default_communicator
    from gatherwise.engine_hooks.logged_path import LoggedLogitsPath
    from gatherwise.modes import Mode, ModeTable

    hooks, source = _hooks(default_communicator(), graph_modes)
    wrapped = _wrapped(hooks)
    runner = StandInDecodeGraphRunner(hooks, wrapped, rank, world)
    runner.capture()
    installed = hooks.installed
    assert installed is not None and isinstance(installed.logits_path, LoggedLogitsPath)  # as _hooks installed it
    path = installed.logits_path
    keys = sorted(str(k) for k in runner.graphs)
    assert path.call_index == 0 and not path.mode_log  # capturing ran and recorded no call

    steps = []
    for i, (rows, request) in enumerate(schedule):
        if request is not None and rank == 0:
            assert source is not None  # rank 0's
            source.request(ModeTable.uniform(Mode.parse(request)))
        batch = _batch(rows)
        batch.logits = _full_logits(i, rows)

        def model_step(_worker, *_args, batch=batch, **_kwargs):  # ModelRunner.forward, then the sampler
            replayed = runner.can_run_graph(batch)
            logits = runner.execute(batch) if replayed else runner.forward(batch.logits, batch)
            out = SimpleNamespace(next_token_logits=logits)
            ids = wrapped["sample"](_sampler, None, out, batch.sampling_info, False)
            return replayed, ids

        replayed, ids = wrapped["step"](model_step, SimpleNamespace(), batch, batch, None, False)
        key = runner.replayed[-1] if replayed else None
        steps.append((replayed, ids.tolist(), key))
    expected = [_full_logits(i, rows).argmax(-1).tolist() for i, (rows, _) in enumerate(schedule)]
    return keys, steps, expected, [m.label for m in path.mode_log], path.call_index


SCHEDULE = [(1, None), (3, None), (4, "gather"), (2, None), (3, None), (1, None), (4, "sharded"), (2, None),
            (3, None), (1, "all_gather"), (2, None), (4, None)]
# A request is adopted two calls after the call it arrived with (gatherwise.engine_hooks.deferred_word).
MODES = ["all_gather"] * 4 + ["gather"] * 4 + ["sharded"] * 3 + ["all_gather"]


def test_each_mode_replays_its_own_graph_sharded_runs_eagerly_and_tokens_match():
    results = run_ranks(_serve, 2, "all_gather,gather", SCHEDULE, timeout=150)
    for keys, steps, expected, modes, calls in results:
        assert keys == sorted(str((bs, None, f"gatherwise:{m}", None)) for bs in CAPTURE_BS
                              for m in ("all_gather", "gather"))
        assert [ids for _, ids, _ in steps] == expected  # same tokens as an argmax of the full logits, every step
        assert modes == MODES and calls == len(SCHEDULE)  # every call recorded, in the table's mode
        # a replayed step replays the graph of its mode, padded up to the next captured size; sharded: eager
        assert [key for _, _, key in steps] == [
            None if m == "sharded" else (CAPTURE_BS[bisect.bisect_left(CAPTURE_BS, rows)], None,
                                         f"gatherwise:{m}", None) for (rows, _), m in zip(SCHEDULE, MODES, strict=True)]
    assert results[0][1] == results[1][1]


def test_a_mode_left_out_of_graph_modes_runs_eagerly():
    results = run_ranks(_serve, 2, "gather", SCHEDULE, timeout=150)
    for keys, steps, expected, modes, _ in results:
        assert keys == sorted(str((bs, None, "gatherwise:gather", None)) for bs in CAPTURE_BS)
        assert [ids for _, ids, _ in steps] == expected and modes == MODES
        assert [replayed for replayed, _, _ in steps] == [m == "gather" for m in MODES]


def _hooks_off(rank, world, disabled):
    """Hooks off before capture (disabled), or the gatherer never reached while capturing (not installed)."""
    from gatherwise.engine_hooks.comm import default_communicator

    hooks, _ = _hooks(default_communicator(), "all_gather,gather", installed=False)
    if disabled:
        hooks.disabled = "stand-in reason"
    wrapped = _wrapped(hooks)
    runner = StandInDecodeGraphRunner(hooks, wrapped, rank, world)
    # the gatherer never reached: the stand-in forward bypasses it, as a fused-softcap model would
    runner.forward = lambda logits, batch: runner._all_gather(  # type: ignore[method-assign]
        logits[:, rank * VOCAB // world: (rank + 1) * VOCAB // world])
    runner.capture()
    batch = _batch(3)
    batch.logits = _full_logits(0, 3)
    replayed = runner.can_run_graph(batch)
    out = runner.execute(batch)
    return sorted(str(k) for k in runner.graphs), hooks.graphs.passes, replayed, torch.equal(out, batch.logits)


@pytest.mark.parametrize("disabled", [True, False], ids=["disabled-before-capture", "gatherer-bypassed"])
def test_without_active_hooks_sglang_captures_and_replays_as_before(disabled):
    for keys, passes, replayed, same in run_ranks(_hooks_off, 2, disabled, timeout=150):
        label = "None" if disabled else "'gatherwise:all_gather'"  # one plain pass, keyed consistently
        assert keys == sorted(f"({bs}, None, {label}, None)" for bs in CAPTURE_BS)
        assert len(passes) == (0 if disabled else 1) and replayed and same


def test_graph_modes_setting():
    from gatherwise.config import load_config
    from gatherwise.engine_hooks.adapters.sglang.graphs import GRAPH_MODES, fold_label, parse_graph_modes
    from gatherwise.engine_hooks.graphs import CAPTURABLE
    from gatherwise.modes import Mode

    assert GRAPH_MODES == CAPTURABLE
    assert parse_graph_modes("gather, all_gather") == (Mode.ALL_GATHER, Mode.GATHER)
    assert parse_graph_modes("gather") == (Mode.GATHER,)
    with pytest.raises(ValueError, match="'sharded' cannot be captured"):
        parse_graph_modes("all_gather,sharded")
    with pytest.raises(ValueError, match="names no mode"):
        parse_graph_modes(" , ")
    assert fold_label(None, Mode.GATHER) == "gatherwise:gather"
    assert fold_label("nolora", Mode.ALL_GATHER) == "nolora|gatherwise:all_gather"
    assert load_config(None, env={}).engine.graph_modes == "all_gather,gather"
    assert load_config(None, env={"GATHERWISE_ENGINE_GRAPH_MODES": "gather"}).engine.graph_modes == "gather"
    with pytest.raises(ValueError, match="graph_modes"):
        load_config(None, env={"GATHERWISE_ENGINE_GRAPH_MODES": "scatter"})
