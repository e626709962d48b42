"""The TP engine on real gloo ranks: P=2 and P=3 produce P=1's tokens in every mode and schedule.

One spawn per P runs the whole suite (random models, odd vocabs, checkpoints, 50+ schedules) and the P=1
reference runs in this process, so the file stays within a few minutes on two shared cores.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from gatherwise.engine_hooks.handshake import HandshakeError, handshake
from gatherwise.engine_hooks.logged_path import LoggedLogitsPath
from gatherwise.engine_hooks.sampling import SamplingParams
from gatherwise.engine_hooks.sharded_exchange import collectives_for
from gatherwise.modes import Mode, ModeTable
from gatherwise.tp_engine.hf_config import config_from_hf
from gatherwise.tp_engine.launch import LaunchError, launch
from gatherwise.tp_engine.runner import DTYPES, Engine, GenerateSpec, ModelSpec, generate_rank, make_path
from gatherwise.tp_engine.scheduler import StepBatch, make_requests
from gatherwise.tp_engine.weights import RandomSource
from tests._counting_comm import CountingComm
from tests._generate_cli import assert_refused, generate_json

SAMPLING = (
    SamplingParams(),
    SamplingParams(temperature=0.8, seed=5),
    SamplingParams(temperature=1.0, top_k=40, seed=6),
    SamplingParams(temperature=0.7, top_p=0.9, seed=7),
    SamplingParams(temperature=1.3, top_k=20, top_p=0.8, seed=8),
)
NUM_SCHEDULES = 50
SPAWN_TIMEOUT = 240
SYNTHETIC_SIZES = [1, 64, 17, 2, 33, 8, 64, 1, 5, 40, 3, 16]


@dataclass(frozen=True)
class Case:
    name: str
    model: int  # index into the suite's model list
    mode: str
    params: tuple[SamplingParams, ...]  # rotated over the requests
    num: int = 6
    max_new_tokens: int = 6
    seed: int = 0
    max_gap: int = 2
    max_batch: int = 16
    logits_dtype: str = "float32"


def probe_tokens(vocab: int) -> list[int]:
    return [(i * 7919 + 13) % vocab for i in range(9)]


def run_suite(rank: int, world: int, models: list[ModelSpec], cases: list[Case]) -> dict:
    """Rank main (also the in-process P=1 reference): every case on models loaded once."""
    from gatherwise.engine_hooks.comm import default_communicator
    from gatherwise.tp_engine.layers import TPGroup

    torch.set_num_threads(1)
    tp, comm = TPGroup.from_dist(), CountingComm(default_communicator())
    loaded, probes, results = [], [], []
    for spec in models:
        model = spec.load(tp)
        handshake(comm, config_hash=spec.config_hash(model.config), table=ModeTable.uniform(Mode.ALL_GATHER),
                  vocab=model.config.vocab_size, dtype=torch.float32)
        tokens = probe_tokens(model.config.vocab_size)
        out = torch.empty(len(tokens), model.shard_width, dtype=torch.float64)
        model.forward(torch.tensor(tokens), torch.arange(len(tokens)), torch.zeros(len(tokens), dtype=torch.int64),
                      model.new_cache(1, len(tokens)), torch.arange(len(tokens)), out)
        loaded.append(model)
        probes.append(out)
    for case in cases:
        model = loaded[case.model]
        vocab = model.config.vocab_size
        path = make_path(comm, vocab, case.mode, DTYPES[case.logits_dtype], model.device)
        counted: list[int] = []  # collectives each call issued
        sharded_calls: list[int] = []  # what each call would have cost in sharded mode
        last = [comm.count]

        def on_step(batch: StepBatch, tokens: torch.Tensor, counted: list[int] = counted, last: list[int] = last,
                    sharded_calls: list[int] = sharded_calls, width: int = path.width) -> None:
            counted.append(comm.count - last[0])
            last[0] = comm.count
            sharded_calls.append(collectives_for(batch.rows, width))  # what this call costs in sharded mode

        requests = make_requests(case.num, vocab, case.max_new_tokens, case.seed, list(case.params),
                                 max_gap=case.max_gap)
        run = Engine(model, path, case.max_batch).generate(requests, on_step)
        results.append(dict(tokens=run.tokens, modes=run.modes, collectives=run.collectives, counted=counted,
                            batch_sizes=run.batch_sizes, sharded_calls=sharded_calls))
    synthetic = Engine(loaded[1], lambda: make_path(comm, VOCABS[1], "schedule:21", torch.float32, torch.device("cpu")),
                       max_batch=64).synthetic(SYNTHETIC_SIZES)
    assert isinstance(synthetic, LoggedLogitsPath)  # make_path keeps the log by default
    return {"probes": probes, "cases": results, "synthetic": [m.label for m in synthetic.mode_log]}


# -- tiny HF checkpoints written by the test ---------------------------------------------------------------
LLAMA: dict[str, Any] = dict(
             model_type="llama", vocab_size=203, hidden_size=48, intermediate_size=101, num_hidden_layers=2,
             num_attention_heads=6, num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0,
             hidden_act="silu", tie_word_embeddings=False, torch_dtype="float32")
QWEN2: dict[str, Any] = dict(
             model_type="qwen2", vocab_size=151, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1000000.0,
             hidden_act="silu", tie_word_embeddings=True, torch_dtype="bfloat16")
VOCABS = (32000, 1001, LLAMA["vocab_size"], QWEN2["vocab_size"])  # of the suite's models, in order


def write_checkpoint(directory: Path, raw: dict, dtype: torch.dtype, files: int, seed: int) -> Path:
    from safetensors.torch import save_file

    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(raw))
    cfg = config_from_hf(raw)
    tensors = {name: t.to(dtype) for name, t in RandomSource(cfg, seed).state_dict().items()}
    names = sorted(tensors)
    for i in range(files):
        part = {n: tensors[n].contiguous() for n in names[i::files]}
        save_file(part, str(directory / f"model-{i + 1:05d}-of-{files:05d}.safetensors"), metadata={"format": "pt"})
    return directory


def reference_logits(checkpoint: Path, tokens: list[int]) -> torch.Tensor:
    """A plain single-process forward of the whole prompt from the HF tensors: [T, V] float64."""
    from safetensors.torch import load_file

    raw = json.loads((checkpoint / "config.json").read_text())
    sd = {}
    for f in checkpoint.glob("*.safetensors"):
        sd.update({k: v.to(torch.float64) for k, v in load_file(str(f)).items()})
    heads, kv_heads = raw["num_attention_heads"], raw["num_key_value_heads"]
    hd, eps, n = raw["hidden_size"] // heads, raw["rms_norm_eps"], len(tokens)
    norm = lambda x, w: x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w
    inv_freq = raw["rope_theta"] ** (-torch.arange(hd // 2, dtype=torch.float64) * 2 / hd)
    freqs = torch.arange(n, dtype=torch.float64)[:, None] * inv_freq

    def rope(x):  # rotate pairs (i, i + hd/2)
        a, b = x[..., : hd // 2], x[..., hd // 2:]
        c, s = freqs.cos()[:, None], freqs.sin()[:, None]
        return torch.cat([a * c - b * s, b * c + a * s], dim=-1)

    x = sd["model.embed_tokens.weight"][tokens]
    for i in range(raw["num_hidden_layers"]):
        p = f"model.layers.{i}."
        proj = lambda h, name: h @ sd[p + name + ".weight"].T + sd.get(p + name + ".bias", 0.0)  # noqa: B023
        h = norm(x, sd[p + "input_layernorm.weight"])
        q = rope(proj(h, "self_attn.q_proj").view(n, heads, hd))
        k = rope(proj(h, "self_attn.k_proj").view(n, kv_heads, hd)).repeat_interleave(heads // kv_heads, 1)
        v = proj(h, "self_attn.v_proj").view(n, kv_heads, hd).repeat_interleave(heads // kv_heads, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        x = x + proj(torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, -1), "self_attn.o_proj")
        h = norm(x, sd[p + "post_attention_layernorm.weight"])
        x = x + proj(torch.nn.functional.silu(proj(h, "mlp.gate_proj")) * proj(h, "mlp.up_proj"), "mlp.down_proj")
    head = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
    return norm(x, sd["model.norm.weight"]) @ head.T


# -- the suite: built once, run once per P -----------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    base = tmp_path_factory.mktemp("checkpoints")
    return [write_checkpoint(base / "llama", LLAMA, torch.float32, files=2, seed=3),
            write_checkpoint(base / "qwen2", QWEN2, torch.bfloat16, files=1, seed=4)]


@pytest.fixture(scope="module")
def suite(checkpoints: list[Path]) -> tuple[list[ModelSpec], list[Case]]:
    models = [ModelSpec(vocab=32000), ModelSpec(vocab=1001, weights_seed=1)]
    models += [ModelSpec(checkpoint=str(c)) for c in checkpoints]
    cases = []
    for mode in ("all_gather", "gather", "sharded", "schedule:7"):
        cases.append(Case(f"32000 {mode} greedy", 0, mode, SAMPLING[:1], seed=1))
        cases.append(Case(f"32000 {mode} sampled", 0, mode, SAMPLING, seed=2))
    for s in range(NUM_SCHEDULES):
        cases.append(Case(f"1001 schedule:{s}", 1, f"schedule:{1000 + s}", SAMPLING[s % 5:] + SAMPLING[: s % 5],
                          num=6, max_new_tokens=4, seed=100 + s))
    cases.append(Case("1001 batches 1..16", 1, "schedule:3", SAMPLING, num=40, max_new_tokens=10, seed=9,
                      max_gap=1))
    cases.append(Case("1001 bfloat16 gather", 1, "gather", SAMPLING, seed=10, logits_dtype="bfloat16"))
    for m in (2, 3):
        cases.append(Case(f"checkpoint {m} greedy", m, "all_gather", SAMPLING[:1], seed=11))
        cases.append(Case(f"checkpoint {m} sampled", m, "schedule:5", SAMPLING, num=8, seed=12))
    return models, cases


_RUNS: dict[int, list[dict]] = {}


@pytest.fixture(scope="module")
def runs(suite):
    def get(world: int) -> list[dict]:
        if world not in _RUNS:
            if world == 1:
                threads = torch.get_num_threads()
                try:
                    _RUNS[1] = [run_suite(0, 1, *suite)]
                finally:
                    torch.set_num_threads(threads)
            else:
                _RUNS[world] = launch(run_suite, world, *suite, timeout=SPAWN_TIMEOUT)
        return _RUNS[world]
    yield get
    _RUNS.clear()


def case_index(suite: tuple[list[ModelSpec], list[Case]], name: str) -> int:
    return next(i for i, c in enumerate(suite[1]) if c.name == name)


def each_rank_case(suite: tuple[list[ModelSpec], list[Case]], runs: Callable[[int], list[dict]],
                   world: int) -> Iterator[tuple[Case, dict, int, dict]]:
    """(case, its P=1 result, rank, that rank's result) for every case and every rank of the P=world run."""
    reference, ranks = runs(1)[0], runs(world)
    for i, case in enumerate(suite[1]):
        for rank, result in enumerate(ranks):
            yield case, reference["cases"][i], rank, result["cases"][i]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [2, 3])
def test_tokens_match_tp1_in_every_mode_and_schedule(world, suite, runs):
    for case, reference, rank, got in each_rank_case(suite, runs, world):
        want = reference["tokens"]
        assert all(0 <= t < VOCABS[case.model] for toks in want.values() for t in toks), case.name
        assert got["tokens"] == want, f"{case.name}: P={world} rank {rank} differs from P=1"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [2, 3])
def test_modes_agree_and_collectives_are_fixed_by_mode_and_kinds(world, suite, runs):
    for case, reference, rank, got in each_rank_case(suite, runs, world):
        modes = reference["modes"]
        assert got["modes"] == modes, f"{case.name}: rank {rank} modes differ"
        # all_gather: 1; gather: gather + broadcast; sharded: 1, or 2 when temperature/top-p rows need it
        want = [1 if m == "all_gather" else 2 if m == "gather" else s
                for m, s in zip(modes, got["sharded_calls"], strict=True)]
        assert got["collectives"] == want and got["counted"] == want, f"{case.name}: rank {rank}"
        if case.mode in ("all_gather", "gather", "sharded"):
            assert set(modes) == {case.mode}


def test_schedules_really_switch(suite, runs):
    cases = [i for i, c in enumerate(suite[1]) if c.name.startswith("1001 schedule:")]
    assert len(cases) >= 50
    seen = [set(runs(1)[0]["cases"][i]["modes"]) for i in cases]
    assert set().union(*seen) == {"all_gather", "gather", "sharded"}
    switched = sum(len(s) >= 2 for s in seen)
    assert switched >= 25, f"only {switched} of {len(cases)} schedules ran more than one mode"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [2, 3])
def test_synthetic_load_up_to_64_rows_agrees_on_modes(world, runs):
    want = runs(1)[0]["synthetic"]
    assert len(want) == len(SYNTHETIC_SIZES) and len(set(want)) >= 2
    assert all(r["synthetic"] == want for r in runs(world))


def test_batch_sizes_move_between_1_and_16(suite, runs):
    sizes = runs(1)[0]["cases"][case_index(suite, "1001 batches 1..16")]["batch_sizes"]
    assert min(sizes) == 1 and max(sizes) == 16
    assert len(set(sizes)) >= 10
    assert sum(a != b for a, b in itertools.pairwise(sizes)) >= len(sizes) // 3


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [1, 2, 3])
def test_logits_match_across_p_and_a_plain_reference(world, suite, runs, checkpoints):
    models = suite[0]
    ranks = runs(world)
    for m, spec in enumerate(models):
        vocab = VOCABS[m]
        full = torch.cat([r["probes"][m] for r in ranks], dim=1)
        assert torch.all(full[:, vocab:] == 0), "LM head padding rows must be zero"
        logits = full[:, :vocab]
        if world > 1:
            torch.testing.assert_close(logits, runs(1)[0]["probes"][m][:, :vocab], rtol=1e-12, atol=1e-12)
        if spec.checkpoint is not None:
            want = reference_logits(Path(spec.checkpoint), probe_tokens(vocab))
            torch.testing.assert_close(logits, want, rtol=1e-10, atol=1e-10)


def test_random_model_matches_the_reference_too(tmp_path):
    spec = ModelSpec(vocab=1001, weights_seed=1)
    config, _source = spec.config_and_source()
    raw = dict(model_type="llama", vocab_size=1001, hidden_size=config.hidden_size,
               intermediate_size=config.intermediate_size, num_hidden_layers=config.num_layers,
               num_attention_heads=config.num_heads, num_key_value_heads=config.num_kv_heads,
               rms_norm_eps=config.rms_norm_eps, rope_theta=config.rope.theta)
    ckpt = write_checkpoint(tmp_path / "random", raw, torch.float64, files=1, seed=1)
    result = run_suite(0, 1, [spec, ModelSpec(checkpoint=str(ckpt))], [])
    want = reference_logits(ckpt, probe_tokens(1001))
    for probe in result["probes"]:
        torch.testing.assert_close(probe[:, :1001], want, rtol=1e-10, atol=1e-10)


def test_checkpoint_greedy_tokens_match_the_reference(suite, runs, checkpoints):
    for name, ckpt in zip(("checkpoint 2 greedy", "checkpoint 3 greedy"), checkpoints, strict=True):
        case = suite[1][case_index(suite, name)]
        vocab = json.loads((ckpt / "config.json").read_text())["vocab_size"]
        got = runs(1)[0]["cases"][case_index(suite, name)]["tokens"]
        for req in make_requests(case.num, vocab, case.max_new_tokens, case.seed, list(case.params)):
            seq = list(req.prompt)
            for _ in range(req.max_new_tokens):  # full recompute per token: no KV cache involved
                seq.append(int(reference_logits(ckpt, seq)[-1].to(torch.float32).argmax()))
            assert got[req.request_id] == seq[len(req.prompt):], f"{name} request {req.request_id}"


# -- handshake ------------------------------------------------------------------------------------------------
def mismatched_ranks(rank: int, world: int, out_dir: str) -> None:
    """Two refusals caught on every rank (written to out_dir), then a third left to fail the launch."""
    errors = []
    for model, mode in ((ModelSpec(vocab=1001 + 2 * rank), "all_gather"),
                        (ModelSpec(vocab=1001), "all_gather" if rank == 0 else "gather")):
        try:
            generate_rank(rank, world, GenerateSpec(model=model, mode=mode, num_prompts=2, max_new_tokens=2))
            errors.append("no error")
        except HandshakeError as exc:
            errors.append(str(exc))
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(errors))
    generate_rank(rank, world, GenerateSpec(model=ModelSpec(vocab=1001, weights_seed=rank), num_prompts=2))


@pytest.mark.timeout(300)
def test_handshake_refuses_mismatched_ranks_without_hanging(tmp_path):
    with pytest.raises(LaunchError) as info:
        launch(mismatched_ranks, 2, str(tmp_path), timeout=120)
    text = str(info.value)
    assert "2 of 2 ranks failed" in text
    assert "rank 0: HandshakeError: gatherwise handshake failed" in text
    assert "rank 1: HandshakeError: gatherwise handshake failed" in text
    assert "rank 1 has a different config hash than rank 0" in text  # weights seed differs
    for rank in (0, 1):
        vocab, table = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert "handshake failed" in vocab and "rank 1 has a different vocab than rank 0 (1003 != 1001)" in vocab
        assert "handshake failed" in table and "rank 1 has a different initial table than rank 0" in table


# -- the command line -----------------------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_cli_tp2_prints_tp1_tokens():
    args = ("--mode", "schedule:4", "--prompts", "5", "--max-new-tokens", "5", "--temperature", "0.9", "--top-k",
            "50", "--top-p", "0.95", "--seed", "3")
    one, two = generate_json("--tp", "1", *args), generate_json("--tp", "2", *args)
    assert set(two) == {"prompt_ids", "tokens", "finish_reasons", "modes", "collectives"}  # no tokenizer: no text
    assert two["tokens"] == one["tokens"] and len(two["tokens"]) == 5
    assert two["prompt_ids"] == one["prompt_ids"] and len(two["prompt_ids"]) == 5
    assert len(two["modes"]) == 2 and two["modes"][0] == two["modes"][1] == one["modes"][0]
    # every row samples top-k (with top-p inside it): a sharded call is one exchange of the k best per row
    assert two["collectives"][0] == [{"all_gather": 1, "gather": 2, "sharded": 1}[m] for m in two["modes"][0]]


@pytest.mark.parametrize("argv, message", [
    (["--mode", "scatter"], "invalid mode 'scatter'"),
    (["--mode", "schedule:x"], "schedule:SEED"),
    (["--tp", "0"], "must be >= 1"),
    (["--top-p", "0"], "must be > 0.0"),
    (["--temperature", "-1"], "must be >= 0.0"),
    (["--dtype", "float64"], "invalid choice"),
    (["--checkpoint", "x", "--vocab", "7"], "--vocab applies to the random model only"),
    (["--tp", "5"], "--tp 5 exceeds the model's 4 attention heads"),
    (["--checkpoint", "/nonexistent"], "no config.json in checkpoint directory /nonexistent"),
])
def test_cli_rejects_bad_arguments(argv, message, capsys):
    assert_refused(argv, message, capsys)
