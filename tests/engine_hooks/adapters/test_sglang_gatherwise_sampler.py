"""`engine.sampler: gatherwise` in the SGLang adapter, on CPU: which sampled batches gatherwise's sampler takes,
the rows it builds from SGLang's batch (parameters from SamplingBatchInfo with SGLang's "off" encodings
normalised, the key from the request, the position from the sequence length), and the hooks driving two real gloo
ranks through SGLang's patched call sequence (step, logits gather, sampler) in every mode: the same tokens in
all_gather, gather and sharded, on both ranks, as gatherwise's sampler gives on the full logits; no rank draws
from its generator; a batch it cannot honour keeps SGLang's sampler (all_gather where the table says sharded);
and such calls never replay a CUDA graph.

No SGLang needed: its batches are faked with the fields of SGLang 0.5.23 the adapter reads (the engine tests in
tests/sglang run the real thing).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Literal

import pytest
import torch

from tests._dist import run_ranks

if TYPE_CHECKING:
    from gatherwise.engine_hooks.adapters.sglang.step import SglangStepHooks
    from gatherwise.engine_hooks.comm import Communicator
    from gatherwise.engine_hooks.table_source import InProcessTableSource

PADDED = 16  # SGLang's padded LM head: two shards of 8
VOCAB = 14  # the model's vocab: SGLang trims the last 2 columns after its gather
TOP_K_ALL = 1 << 30  # SGLang's top_k "whole vocabulary"


class Info:
    """What the adapter reads of SGLang's SamplingBatchInfo."""

    def __init__(self, params: list[tuple[float, float, int, float]], **fields: object) -> None:
        temperature, top_p, top_k, min_p = zip(*params, strict=True)
        self.temperatures = torch.tensor(temperature, dtype=torch.float32).view(-1, 1)
        self.top_ps = torch.tensor(top_p, dtype=torch.float32)
        self.top_ks = torch.tensor(top_k, dtype=torch.int32)
        self.min_ps = torch.tensor(min_p, dtype=torch.float32)
        self.is_all_greedy = all(k <= 1 for k in top_k)
        self.need_top_p_sampling = any(p != 1.0 for p in top_p)
        self.need_top_k_sampling = any(k != TOP_K_ALL for k in top_k)
        self.need_min_p_sampling = any(m > 0 for m in min_p)
        self.vocab_size = VOCAB
        self.penalizer_orchestrator = SimpleNamespace(is_required=False)
        self.logit_bias = self.acc_additive_penalties = self.acc_scaling_penalties = None
        self.sampling_mask_batch_indices = self.grammars = None
        self.has_custom_logit_processor = self.has_watermark_candidates = False
        for name, value in fields.items():
            setattr(self, name, value)

    def __len__(self) -> int:
        return len(self.temperatures)


TOP_P = (0.8, 0.95, TOP_K_ALL, 0.0)
TOP_K = (0.7, 1.0, 3, 0.0)
MIN_P = (1.0, 1.0, TOP_K_ALL, 0.2)
GREEDY = (1.0, 1.0, 1, 0.0)  # SGLang's greedy row: temperature 0 became temperature 1, top_k 1


def _req(rid: str, prompt: int, seed: int | None = None) -> SimpleNamespace:
    return SimpleNamespace(rid=rid, sampling_params=SimpleNamespace(sampling_seed=seed), origin_input_ids=[5] * prompt,
                           beam_group=None)


def _batches(reqs, seq_lens, params, *, return_logprob=False, mode="DECODE", **info):
    """(ScheduleBatch, ForwardBatch) as the step hook and the logits gather see them."""
    schedule = SimpleNamespace(reqs=reqs, seq_lens_cpu=torch.tensor(seq_lens), beam_tail=None)
    forward = SimpleNamespace(forward_mode=SimpleNamespace(name=mode), sampling_info=Info(params, **info),
                              batch_size=len(reqs), return_logprob=return_logprob, is_prefill_only=False)
    return schedule, forward


# -- which batches, which rows ---------------------------------------------------------------------------------
@pytest.mark.parametrize("change,why", [
    ({}, None), ({"return_logprob": True}, "logprobs"),
    ({"penalizer_orchestrator": SimpleNamespace(is_required=True)}, "penalties"),
    ({"acc_additive_penalties": object()}, "penalties"), ({"acc_scaling_penalties": object()}, "penalties"),
    ({"logit_bias": object()}, "logit bias"), ({"grammars": [object()]}, "a grammar"),
    ({"has_custom_logit_processor": True}, "a custom logit processor"),
    ({"has_watermark_candidates": True}, "watermarks"),
    ({"sampling_mask_batch_indices": object()}, "sampling-mask capture"),
])
def test_batches_that_gatherwises_sampler_cannot_honour_are_named(change, why):
    from gatherwise.engine_hooks.adapters.sglang.sampled_rows import refusal

    schedule, forward = _batches([_req("a", 3), _req("b", 4)], [4, 6], [TOP_P, TOP_K], **change)
    assert refusal(forward, schedule, SimpleNamespace(sampling_observer=None), 2) == why


def test_observers_beam_search_and_unmatched_rows_keep_sglangs_sampler():
    from gatherwise.engine_hooks.adapters.sglang.sampled_rows import refusal

    schedule, forward = _batches([_req("a", 3)], [4], [TOP_P])
    active = SimpleNamespace(sampling_observer=SimpleNamespace(is_active=lambda info: True))
    idle = SimpleNamespace(sampling_observer=SimpleNamespace(is_active=lambda info: False))
    assert refusal(forward, schedule, active, 1) == "a sampling observer"
    assert refusal(forward, schedule, idle, 1) is None
    assert refusal(forward, schedule, idle, 2) == "2 logit rows for 1 requests"
    assert refusal(forward, None, idle, 1) == "no host view of the batch's requests"
    schedule.reqs[0].beam_group = object()
    assert refusal(forward, schedule, idle, 1) == "beam search"


def test_rows_take_sglangs_parameters_with_its_off_encodings_normalised():
    from gatherwise.engine_hooks.adapters.sglang.sampled_rows import row_params
    from gatherwise.engine_hooks.sampling_params import SamplingParams

    assert row_params(1.0, 1.0, 1, 0.0, VOCAB) == SamplingParams()  # SGLang's greedy: gatherwise's greedy
    assert row_params(0.8, 0.9, 1, 0.0, VOCAB) == SamplingParams()  # any top_k = 1 row is the argmax
    assert row_params(0.8, 0.95, TOP_K_ALL, 0.0, VOCAB) == SamplingParams(temperature=0.8, top_p=0.95)
    assert row_params(0.7, 1.0, 3, 0.0, VOCAB) == SamplingParams(temperature=0.7, top_k=3)
    assert row_params(0.7, 1.0, VOCAB, 0.0, VOCAB) == SamplingParams(temperature=0.7)  # keeps every token
    assert row_params(1.0, 1.0, TOP_K_ALL, 0.2, VOCAB) == SamplingParams(temperature=1.0, min_p=0.2)


def test_rows_are_keyed_by_the_request_and_the_index_of_the_token_it_produces():
    from gatherwise.engine_hooks.adapters.sampler_rows import SEEDED_REQUEST
    from gatherwise.engine_hooks.adapters.sglang.sampled_rows import batch_rows
    from gatherwise.stable_hash import stable_hash

    # a: prompt of 3, seq_len 7 with this step's token: its fifth output token (index 4); b: its prefill
    # (seq_len = prompt: the first token); c: seeded, a chunk of a longer prompt (SGLang drops that token)
    reqs = [_req("a", 3), _req("b", 6), _req("c", 9, seed=77)]
    schedule, forward = _batches(reqs, [7, 6, 4], [TOP_P, GREEDY, MIN_P])
    rows = batch_rows(forward.sampling_info, schedule, VOCAB, sampler_seed=11)
    assert [(r.request_id, r.position) for r in rows] == [(stable_hash("a"), 4), (stable_hash("b"), 0),
                                                          (SEEDED_REQUEST, 0)]
    assert [r.params.seed for r in rows] == [11, 11, 77]
    assert rows[0].params.temperature == pytest.approx(0.8) and rows[0].params.top_p == pytest.approx(0.95)
    assert rows[1].params.greedy and rows[2].params.min_p == pytest.approx(0.2)


# -- the hooks on two ranks ------------------------------------------------------------------------------------
def _full_logits(step: int, rows: int) -> torch.Tensor:
    return torch.randn(rows, PADDED, generator=torch.Generator().manual_seed(900 + step)) * 3


def _expected(logits: torch.Tensor, schedule: SimpleNamespace, info: Info, sampler_seed: int,
              softcap: float | None) -> list[int]:
    """gatherwise's sampler on each row's full logits (padding at -inf) alone, in the all_gather layout: what a
    request draws whatever the mode and whatever else shares its batch."""
    from gatherwise.engine_hooks.adapters.sglang.sampled_rows import batch_rows
    from gatherwise.engine_hooks.sampling import sample

    full = logits.clone() if softcap is None else softcap * torch.tanh(logits / softcap)  # SGLang's soft-capping
    full[:, VOCAB:] = float("-inf")
    shards = full.view(full.shape[0], 2, PADDED // 2).permute(1, 0, 2).contiguous()
    rows = batch_rows(info, schedule, VOCAB, sampler_seed)
    return [int(sample(shards[:, j:j + 1], PADDED, rows[j:j + 1])[0]) for j in range(len(rows))]


# (requests, seq_lens, params, table requested before the step): the same requests at the same positions in
# different modes and batch compositions; SGLang's sampler keeps the penalty batch
STEPS: list[tuple[list[tuple], list[int], list[tuple[float, float, int, float]], str | None]] = [
    ([("a", 3), ("b", 5)], [4, 6], [TOP_P, TOP_K], None),
    ([("a", 3), ("b", 5)], [5, 7], [TOP_P, TOP_K], "gather"),
    ([("c", 2, 9)], [3], [MIN_P], None),
    ([("a", 3), ("b", 5), ("c", 2, 9)], [6, 8, 4], [TOP_P, TOP_K, MIN_P], None),
    ([("a", 3), ("d", 4)], [7, 5], [TOP_P, GREEDY], "sharded"),
    ([("b", 5)], [9], [TOP_K], None),
    ([("a", 3), ("b", 5), ("c", 2, 9)], [8, 10, 5], [TOP_P, TOP_K, MIN_P], None),
    ([("a", 3), ("d", 4)], [9, 6], [TOP_P, GREEDY], None),
    ([("e", 3)], [4], [TOP_P], None),  # with a penalty: SGLang's sampler, all_gather in a sharded table
    ([("a", 3), ("b", 5)], [10, 11], [TOP_P, TOP_K], "all_gather"),
    ([("a", 3)], [11], [TOP_P], None),
    ([("a", 3), ("b", 5)], [12, 13], [TOP_P, TOP_K], None),
]
PENALTY_STEP = 8
SAMPLER_SEED = 5


def _hooks(comm: Communicator, sampler: Literal["engine", "gatherwise"],
           graph_modes: str = "all_gather,gather") -> tuple[SglangStepHooks, InProcessTableSource | None]:
    from gatherwise.config import EngineSection, GatherwiseConfig
    from gatherwise.engine_hooks.adapters.sglang.step import SglangStepHooks
    from gatherwise.engine_hooks.install import InstalledHooks
    from gatherwise.engine_hooks.logged_path import LoggedLogitsPath
    from gatherwise.engine_hooks.rng_resync import RandomStateResync
    from gatherwise.engine_hooks.table_source import InProcessTableSource
    from gatherwise.modes import Mode, ModeTable

    config = GatherwiseConfig(engine=EngineSection(sampler=sampler, sampler_seed=SAMPLER_SEED,
                                                   graph_modes=graph_modes))
    hooks = SglangStepHooks(config)
    source = InProcessTableSource() if comm.rank == 0 else None
    # what _path installs at the first hooked call (it needs SGLang's TP group)
    path = LoggedLogitsPath(comm, PADDED, initial_table=ModeTable.uniform(Mode.ALL_GATHER), table_source=source)
    hooks.installed = InstalledHooks(path, engine_id=0, engine_dir=None, config=hooks.config)
    hooks.resync = RandomStateResync(comm, "cpu")
    return hooks, source


def _serve(rank, world, softcap):
    from gatherwise.engine_hooks.adapters.sglang import patches as p
    from gatherwise.engine_hooks.adapters.sglang.patches import _HookedGatherer
    from gatherwise.engine_hooks.comm import default_communicator
    from gatherwise.engine_hooks.logged_path import LoggedLogitsPath
    from gatherwise.modes import Mode, ModeTable

    torch.manual_seed(1)  # SGLang seeds every rank alike
    hooks, source = _hooks(default_communicator(), "gatherwise")
    by_target = {target: fn for target, fn, _ in p.wrappers(hooks)}
    processor = SimpleNamespace(vocab_size=VOCAB, final_logit_softcapping=softcap)
    engine_sampled: list[int] = []

    def all_gather(shard):  # SGLang's tensor_model_parallel_all_gather of the logits shards
        parts = [torch.empty_like(shard) for _ in range(world)]
        torch.distributed.all_gather(parts, shard.contiguous())
        return torch.cat(parts, dim=-1)

    def sglang_sampler(_sampler, logits_output, sampling_info, *args, **kwargs):  # draws from the generator
        probs = torch.softmax(logits_output.next_token_logits[:, :VOCAB] / sampling_info.temperatures, -1)
        engine_sampled.append(len(engine_sampled))
        return torch.multinomial(probs, 1).view(-1).to(torch.int32)

    gatherer = _HookedGatherer(all_gather, processor, hooks)
    steps = []
    for i, (reqs, seq_lens, params, request) in enumerate(STEPS):
        if request is not None and rank == 0:
            assert source is not None  # rank 0's
            source.request(ModeTable.uniform(Mode.parse(request)))
        extra = {"penalizer_orchestrator": SimpleNamespace(is_required=True)} if i == PENALTY_STEP else {}
        schedule, forward = _batches([_req(*r) for r in reqs], seq_lens, params, **extra)
        logits = _full_logits(i, len(reqs))
        shard = logits[:, rank * PADDED // 2: (rank + 1) * PADDED // 2].clone()

        def model_step(_worker, *_args, forward=forward, shard=shard):  # ModelRunner.forward, then sample
            def logits_forward(_processor, _batch):
                return gatherer(shard)

            with hooks.logits_call(processor, forward):
                out = SimpleNamespace(next_token_logits=logits_forward(processor, forward))
            return by_target[p.SAMPLER_FORWARD](sglang_sampler, None, out, forward.sampling_info, False)

        generator_before = torch.default_generator.get_state()
        ids = by_target[p.TP_WORKER_FORWARD](model_step, SimpleNamespace(), schedule, forward, None, False)
        drew = not torch.equal(generator_before, torch.default_generator.get_state())
        steps.append((ids.tolist(), str(ids.dtype), drew, _expected(logits, schedule, forward.sampling_info,
                                                                     SAMPLER_SEED, softcap)))
    installed = hooks.installed
    assert installed is not None and isinstance(installed.logits_path, LoggedLogitsPath)  # as _hooks installed it
    return steps, [m.label for m in installed.logits_path.mode_log], engine_sampled


@pytest.mark.parametrize("softcap", [None, 2.0], ids=["plain", "soft-capped"])
def test_sampled_batches_give_the_same_tokens_in_every_mode_on_every_rank(softcap):
    """A soft-capping model's logits are capped on the shards, as SGLang caps the gathered ones."""
    (steps0, modes0, engine0), (steps1, modes1, engine1) = run_ranks(_serve, 2, softcap, timeout=150)
    assert steps0 == steps1 and modes0 == modes1 and engine0 == engine1 == [0]  # only the penalty batch
    # requests adopted two calls after the call that carried them (gatherwise.engine_hooks.deferred_word)
    assert modes0 == ["all_gather"] * 3 + ["gather"] * 3 + ["sharded"] * 2 + ["all_gather"] + ["sharded"] * 2 + \
        ["all_gather"]
    for i, (ids, dtype, drew, expected) in enumerate(steps0):
        if i == PENALTY_STEP:  # SGLang's sampler, in all_gather: every rank draws alike
            assert drew and dtype == "torch.int32"
            continue
        # each row draws what it draws alone on the full logits; no rank touched its generator
        assert ids == expected and dtype == "torch.int32" and not drew, i


def test_the_engines_sampler_stays_the_default():
    """engine.sampler: engine (the default): sampled batches in a sharded table run all_gather and SGLang's
    sampler, as before."""
    (steps0, modes0, engine0), (steps1, _, _) = run_ranks(_serve_engine_sampler, 2, timeout=150)
    assert steps0 == steps1 and modes0 == ["all_gather"] * 4 and engine0 == [0, 1, 2, 3]


def _serve_engine_sampler(rank, world):
    from gatherwise.engine_hooks.adapters.sglang import patches as p
    from gatherwise.engine_hooks.adapters.sglang.patches import _HookedGatherer
    from gatherwise.engine_hooks.comm import default_communicator
    from gatherwise.engine_hooks.logged_path import LoggedLogitsPath
    from gatherwise.modes import Mode, ModeTable

    torch.manual_seed(1)
    hooks, source = _hooks(default_communicator(), "engine")
    if rank == 0:
        assert source is not None  # rank 0's
        source.request(ModeTable.uniform(Mode.SHARDED))
    by_target = {target: fn for target, fn, _ in p.wrappers(hooks)}
    processor = SimpleNamespace(vocab_size=VOCAB, final_logit_softcapping=None)
    engine_sampled: list[int] = []

    def all_gather(shard):
        parts = [torch.empty_like(shard) for _ in range(world)]
        torch.distributed.all_gather(parts, shard.contiguous())
        return torch.cat(parts, dim=-1)

    def sglang_sampler(_sampler, logits_output, sampling_info, *args, **kwargs):
        engine_sampled.append(len(engine_sampled))
        return torch.multinomial(torch.softmax(logits_output.next_token_logits[:, :VOCAB], -1), 1).view(-1).int()

    gatherer = _HookedGatherer(all_gather, processor, hooks)
    steps = []
    for i in range(4):
        schedule, forward = _batches([_req("a", 3)], [4 + i], [TOP_P])
        shard = _full_logits(i, 1)[:, rank * PADDED // 2: (rank + 1) * PADDED // 2].clone()

        def model_step(_worker, *_args, forward=forward, shard=shard):
            with hooks.logits_call(processor, forward):
                out = SimpleNamespace(next_token_logits=gatherer(shard))
            return by_target[p.SAMPLER_FORWARD](sglang_sampler, None, out, forward.sampling_info, False)

        steps.append(by_target[p.TP_WORKER_FORWARD](model_step, SimpleNamespace(), schedule, forward, None,
                                                    False).tolist())
    installed = hooks.installed
    assert installed is not None and isinstance(installed.logits_path, LoggedLogitsPath)  # as _hooks installed it
    return steps, [m.label for m in installed.logits_path.mode_log], engine_sampled


def _graph_steps(rank, world):
    """Decode graphs captured per mode; a sampled step gatherwise's sampler takes runs eagerly, greedy replays."""
    from gatherwise.engine_hooks.comm import default_communicator
    from tests.engine_hooks.adapters.test_sglang_graphs import StandInDecodeGraphRunner, _wrapped

    hooks, _ = _hooks(default_communicator(), "gatherwise")
    wrapped = _wrapped(hooks)
    runner = StandInDecodeGraphRunner(hooks, wrapped, rank, world)
    runner.processor.final_logit_softcapping = None
    runner.capture()
    seen = []
    for i, params in enumerate([[TOP_P, TOP_K], [GREEDY, GREEDY], [TOP_P, TOP_K]]):
        schedule, forward = _batches([_req("a", 3), _req("b", 5)], [4 + i, 6 + i], params)
        forward.logits = torch.randn(2, PADDED, generator=torch.Generator().manual_seed(i))

        def model_step(_worker, *_args, forward=forward):
            replayed = runner.can_run_graph(forward)
            logits = runner.execute(forward) if replayed else runner.forward(forward.logits, forward)
            out = SimpleNamespace(next_token_logits=logits)
            greedy = lambda _s, o, _i, *a, **k: o.next_token_logits[:, :VOCAB].argmax(-1)
            return replayed, wrapped["sample"](greedy, None, out, forward.sampling_info, False)

        replayed, ids = wrapped["step"](model_step, SimpleNamespace(), schedule, forward, None, False)
        seen.append((replayed, str(ids.dtype)))
    return seen


def test_calls_gatherwises_sampler_takes_never_replay_a_graph():
    for seen in run_ranks(_graph_steps, 2, timeout=150):
        assert seen == [(False, "torch.int32"), (True, "torch.int64"), (False, "torch.int32")]
