"""Keyed sharded sampling (`adapters/sglang/keyed_gumbel.py`) gives SGLang's own deterministic token, bit for bit.

Real gloo ranks hold shards of the same logits (vocab 151936, an LM head's width; float32 and bfloat16; peaked
and flat rows; a padded head whose padding columns would win if they were read; rows built to be near ties across
two shards) and run `sample_keyed_sharded`; the reference is SGLang 0.5.23's whole `Sampler.forward` on the full
rows (`logits.div_(temperatures)`, `torch.softmax`, `sampling_from_probs_torch` and its torch.compile'd
`multinomial_with_seed`, for a seeded batch without top-k / top-p / min-p), the Sampler built without a server
(its __init__ reads the server's context: the few attributes it sets are set by hand).

SGLang's CPU hash dispatches to `sgl_kernel`'s CPU op, which this machine does not have (the stand-in raises), so
the reference's `murmur_hash32` is gatherwise's torch reimplementation, proven equal bit for bit to SGLang's own
Triton kernel (run by Triton's interpreter on CPU) over edge-case seeds, positions and columns.

A combine that trusts the normaliser (one constant per row) to leave the argmax alone — each shard's winner of
logit / temperature + noise, in float64 — is shown to differ from SGLang on the near-tie rows: SGLang's per-column
rounding of softmax and log does reorder columns.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from gatherwise.engine_hooks.adapters.sglang import keyed_gumbel as kg
from gatherwise.engine_hooks.comm import Communicator, SingleRankCommunicator
from tests._dist import run_ranks

VOCAB = 151_936
BATCH = 64
CASES = ("peaked_f32", "flat_f32", "peaked_bf16", "flat_bf16", "padded_f32")
PADDED_VOCAB = 151_900  # a real vocab inside a 151936-wide head: the last 36 columns are padding
RANDOM_BATCHES = {"padded_f32": 1}  # of BATCH rows per case; 3 for the others
NEAR_TIE_BASES = 8
NEAR_TIE_SCAN = 24  # ulps either side of the constructed tie


def _random_batch(case: str, index: int) -> dict:
    """The same tensors in every process: a generator seeded by (case, index)."""
    gen = torch.Generator().manual_seed(1000 * CASES.index(case) + index)
    flat = case.startswith("flat")
    logits = torch.randn(BATCH, VOCAB, generator=gen) * (0.05 if flat else 2.0)
    if not flat:  # a handful of tokens carry most of the mass
        spikes = torch.randint(0, VOCAB, (BATCH, 5), generator=gen)
        logits.scatter_add_(1, spikes, 8.0 + 8.0 * torch.rand(BATCH, 5, generator=gen))
    vocab = PADDED_VOCAB if case.startswith("padded") else VOCAB
    logits[:, vocab:] = 50.0  # padding: would win every row if it took part
    temperatures = torch.ones(BATCH) if flat else 0.25 + 1.25 * torch.rand(BATCH, generator=gen)
    seeds = torch.randint(-(2**63), 2**63 - 1, (BATCH,), generator=gen)
    seeds[: BATCH // 4] = seeds[0]  # one request over consecutive positions
    positions = torch.randint(0, 2**20, (BATCH,), generator=gen)
    positions[: BATCH // 4] = positions[0] + torch.arange(BATCH // 4)
    dtype = torch.bfloat16 if case.endswith("bf16") else torch.float32
    return {"logits": logits.to(dtype), "temperatures": temperatures, "seeds": seeds, "positions": positions,
            "vocab": vocab}


def _sglang_sampler():
    """SGLang's own `Sampler`, with the attributes its __init__ reads from a running server's context (TP group,
    deterministic inference on, no RL on-policy target, not the ascend backend) set by hand."""
    from sglang.srt.layers.sampler import Sampler

    sampler = Sampler.__new__(Sampler)
    torch.nn.Module.__init__(sampler)
    sampler.tp_sync_group = sampler.cp_sync_group = None
    sampler.rl_on_policy_target = None
    sampler.enable_deterministic = True
    sampler.use_log_softmax_logprob = sampler.use_ascend_backend = False
    sampler.sampling_mask_max_tokens = 0
    return sampler


def _sglang_tokens(batch: dict) -> torch.Tensor:
    """SGLang's whole `Sampler.forward` on the full rows (its logits processor has cut them to the vocab), for a
    seeded batch without top-k / top-p / min-p, logprobs, grammars or custom logit processors."""
    info = SimpleNamespace(is_all_greedy=False, need_top_p_sampling=False, need_top_k_sampling=False,
                           need_min_p_sampling=False, temperatures=batch["temperatures"].view(-1, 1),
                           sampling_seed=batch["seeds"], has_custom_logit_processor=False, grammars=None,
                           sampling_mask_batch_indices=None, sampling_support_logprobs_capture_indices=None)
    output = SimpleNamespace(next_token_logits=batch["logits"][:, : batch["vocab"]].clone())
    ids = _sglang_sampler().forward(output, info, False, [], [], batch["positions"])
    assert ids.dtype == torch.int32
    return ids.to(torch.int64)


def _sglang_sampler_functions(batch: dict) -> torch.Tensor:
    """The functions `Sampler.forward` runs for such a batch, called one by one."""
    from sglang.srt.layers import sampler

    logits = batch["logits"][:, : batch["vocab"]].clone()
    logits.div_(batch["temperatures"].view(-1, 1))
    probs = torch.softmax(logits, dim=-1)
    return sampler.sampling_from_probs_torch(probs, batch["seeds"], batch["positions"]).to(torch.int64)


@pytest.fixture(scope="module")
def sglang_hash_patched():
    """SGLang's CPU hash needs the real sgl_kernel; use the reimplementation proven equal to its kernel below."""
    from sglang.srt.layers import sampler

    original = sampler.murmur_hash32
    sampler.murmur_hash32 = kg.murmur_hash32
    yield
    sampler.murmur_hash32 = original


def _near_tie_batches(path: str) -> list[dict]:
    """Rows built around a tie between the row's winner and the best column of the quarter farthest from it (in
    another shard for 2 and 4 ranks alike), the rival's logit scanned ulp by ulp across the tie: SGLang's winner
    flips within the scan."""
    from sglang.srt.layers import sampler

    gen = torch.Generator().manual_seed(77)
    base = torch.randn(NEAR_TIE_BASES, VOCAB, generator=gen) * 0.5
    seeds = torch.randint(0, 2**62, (NEAR_TIE_BASES,), generator=gen)
    positions = torch.randint(0, 4096, (NEAR_TIE_BASES,), generator=gen)
    quarter = VOCAB // 4
    rows, row_seeds, row_positions = [], [], []
    for r in range(NEAR_TIE_BASES):
        x = base[r : r + 1]
        lp = torch.log(torch.softmax(x, dim=-1)).double()
        noise = kg.keyed_noise(seeds[r : r + 1], positions[r : r + 1], torch.arange(VOCAB))
        v = (lp + noise)[0]
        i = int(v.argmax())  # the row's winner; its rival from the quarter farthest away (another shard for 2 or 4)
        far = 3 * quarter if i < VOCAB // 2 else 0
        j = far + int(v[far : far + quarter].argmax())
        target = torch.tensor(float(x[0, i]) + float(noise[0, i]) - float(noise[0, j]), dtype=torch.float32)
        up, down = target.clone(), target.clone()
        values = [target]
        for _ in range(NEAR_TIE_SCAN):
            up = torch.nextafter(up, torch.tensor(float("inf")))
            down = torch.nextafter(down, torch.tensor(float("-inf")))
            values += [up, down]
        # and around the bounds' edge: the pair's two tolerances together (E_i + E_j) decide whether the small
        # exchange decides the row, so offsets just inside and just outside that sum exercise the certificate
        lse = float(torch.logsumexp(x.double(), dim=-1))
        width = float(kg.BOUNDS[torch.float32].at(torch.tensor([float(x[0, i]) - lse, float(target) - lse])).sum())
        for factor in (0.9, 1.1, 1.9, 2.1, 3.0, 6.0):
            values += [target + factor * width / 2, target - factor * width / 2]
        for value in values:
            row = x.clone()
            row[0, j] = value
            rows.append(row)
            row_seeds.append(seeds[r])
            row_positions.append(positions[r])
    logits = torch.cat(rows)
    batches = []
    for start in range(0, logits.shape[0], BATCH):
        chunk = logits[start : start + BATCH]
        batch = {"logits": chunk, "seeds": torch.stack(row_seeds[start : start + BATCH]),
                 "positions": torch.stack(row_positions[start : start + BATCH]), "vocab": VOCAB,
                 "temperatures": torch.ones(chunk.shape[0])}
        batches.append(batch)
    torch.save(batches, path)
    assert sampler.murmur_hash32 is kg.murmur_hash32  # built with the patched reference
    return batches


def _naive_sharded(comm: Communicator, batch: dict) -> torch.Tensor:
    """The wrong combine: trust that the normaliser, one constant per row, cannot change the argmax, and take
    each shard's winner of (logit / temperature + noise) in float64, then the best (value, lowest column) across
    ranks. Exact in real numbers; not SGLang's token where SGLang's per-column rounding reorders a near tie."""
    shard = _shard(batch["logits"], comm.rank, comm.world_size)
    width = shard.shape[1]
    x = kg.scale_by_temperature(shard, batch["temperatures"])
    n_real = max(0, min(width, batch["vocab"] - comm.rank * width))
    columns = torch.arange(comm.rank * width, comm.rank * width + n_real)
    noise = kg.keyed_noise(batch["seeds"], batch["positions"], columns)
    value, index = (x[:, :n_real].double() + noise).max(dim=1)
    best = torch.empty((comm.world_size, x.shape[0], 2), dtype=torch.float64)
    comm.all_gather(best, torch.stack([value, (index + comm.rank * width).double()], dim=1))
    rank = best[:, :, 0].argmax(dim=0)  # first rank on equal values: the lowest column
    return best[:, :, 1].gather(0, rank.unsqueeze(0)).squeeze(0).to(torch.int64)


def _shard(logits: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    width = logits.shape[1] // world
    return logits[:, rank * width : (rank + 1) * width].contiguous()


def _rank(rank: int, world: int, random_batches: list[tuple[str, int]], near_tie_path: str) -> list[dict]:
    from gatherwise.engine_hooks.comm import default_communicator

    torch.set_num_threads(1)  # the ranks share the machine's cores
    comm = default_communicator()
    batches = [_random_batch(case, index) for case, index in random_batches] + torch.load(near_tie_path)
    out = []
    for i, batch in enumerate(batches):
        result = kg.sample_keyed_sharded(comm, _shard(batch["logits"], rank, world), vocab_size=batch["vocab"],
                                         temperatures=batch["temperatures"], seeds=batch["seeds"],
                                         positions=batch["positions"])
        naive = _naive_sharded(comm, batch) if i >= len(random_batches) else None
        out.append({"tokens": result.tokens, "full_rows": result.full_rows, "naive": naive})
    return out


@pytest.fixture(scope="module")
def reference(sglang_hash_patched: None, tmp_path_factory: pytest.TempPathFactory) -> dict:
    path = str(tmp_path_factory.mktemp("keyed") / "near_ties.pt")
    near_ties = _near_tie_batches(path)
    random_batches = [(case, index) for case in CASES for index in range(RANDOM_BATCHES.get(case, 3))]
    batches = [_random_batch(case, index) for case, index in random_batches] + near_ties
    labels = [case for case, _ in random_batches] + ["near_tie"] * len(near_ties)
    return {"path": path, "random": random_batches, "labels": labels,
            "tokens": [_sglang_tokens(batch) for batch in batches]}


@pytest.mark.parametrize("world", [2, 4])
def test_sharded_keyed_tokens_are_sglangs(reference, world):
    step = 1 if world == 2 else 2  # 4 ranks: every other random batch, every near tie
    n_all = len(reference["random"])
    random_batches = reference["random"][::step]
    n_random = len(random_batches)
    expected = reference["tokens"][:n_all][::step] + reference["tokens"][n_all:]
    labels = reference["labels"][:n_all][::step] + reference["labels"][n_all:]
    results = run_ranks(_rank, world, random_batches, reference["path"], timeout=280.0)
    rows = full = full_random = near_tie_naive_wrong = 0
    for i, want in enumerate(expected):
        for by_rank in results:
            assert torch.equal(by_rank[i]["tokens"], want), (labels[i], i)
        assert all(r[i]["full_rows"] == results[0][i]["full_rows"] for r in results)
        rows += want.numel()
        full += results[0][i]["full_rows"]
        full_random += results[0][i]["full_rows"] if i < n_random else 0
        if i >= n_random:
            near_tie_naive_wrong += int((results[0][i]["naive"] != want).sum())
    print(f"world={world}: {rows} rows equal to SGLang's, {full} decided from full rows "
          f"({full_random} of {n_random * BATCH} random rows); "
          f"a per-shard normaliser is wrong on {near_tie_naive_wrong} near-tie rows")
    assert near_tie_naive_wrong > 0  # the normaliser's rounding does reorder columns: the bounds are needed


def test_hash_is_sglangs_triton_kernel():
    """SGLang's own murmur_hash32 Triton kernel, run by Triton's interpreter in a fresh process."""
    script = textwrap.dedent("""
        import os, sys, torch
        from sglang.kernels.ops.sampling import murmur_hash as mh
        from gatherwise.engine_hooks.adapters.sglang.keyed_gumbel import murmur_hash32
        seeds = torch.tensor([0, 1, 12345678901234, 2**63 - 1, -1, -2**63, 2**32 - 1, 2**32], dtype=torch.int64)
        positions = torch.tensor([0, 7, 2**31 - 1, 2**32 + 5, 123, 4095, 1, 2**40 + 3], dtype=torch.int64)
        columns = torch.cat([torch.arange(2048), torch.arange(151936 - 2048, 151936), torch.tensor([2**31, 2**32 + 1])])
        out = torch.empty((seeds.numel(), columns.numel()), dtype=torch.uint32)
        grid = (seeds.numel(), (columns.numel() + 1023) // 1024)
        mh.murmur_hash32_kernel[grid](seeds.to(torch.uint64), positions, columns, out, seeds.numel(),
                                      columns.numel(), BLOCK_SIZE=1024)
        ref = out.to(torch.int64) & 0xFFFFFFFF
        mine = murmur_hash32(seeds, positions, columns)
        sys.exit(0 if torch.equal(mine, ref) and ref.max() > 2**31 else 1)
    """)
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_single_rank_is_sglangs_and_bad_input_is_refused(sglang_hash_patched, dtype):
    batch = _random_batch("peaked_bf16", 7)
    batch["logits"] = batch["logits"].to(dtype)
    result = kg.sample_keyed_sharded(SingleRankCommunicator(), batch["logits"], vocab_size=batch["vocab"],
                                     temperatures=batch["temperatures"], seeds=batch["seeds"],
                                     positions=batch["positions"])
    assert torch.equal(result.tokens, _sglang_tokens(batch))
    assert torch.equal(result.tokens, _sglang_sampler_functions(batch))
    full = kg.sample_full_rows(kg.scale_by_temperature(batch["logits"], batch["temperatures"]),
                               batch["seeds"], batch["positions"])
    assert torch.equal(full, result.tokens)
    args = {"vocab_size": VOCAB, "temperatures": batch["temperatures"], "seeds": batch["seeds"],
            "positions": batch["positions"]}
    with pytest.raises(TypeError, match="float64"):
        kg.sample_keyed_sharded(SingleRankCommunicator(), batch["logits"].double(), **args)
    with pytest.raises(ValueError, match="seeds has 3 entries"):
        kg.sample_keyed_sharded(SingleRankCommunicator(), batch["logits"], **{**args, "seeds": batch["seeds"][:3]})
    with pytest.raises(ValueError, match="cannot hold"):
        kg.sample_keyed_sharded(SingleRankCommunicator(), batch["logits"][:, :1000], **args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rounding_bounds_hold_with_a_margin_of_two(dtype):
    """What the certificate rests on: for each row some constant c has |log p_j - (x_j - lse) - c| <= E_j for every
    column above the floor, log p_j being SGLang's (torch.log of torch.softmax in the dtype). Checked with half of
    each E_j, from flat to peaked rows."""
    bound = kg.BOUNDS[dtype]
    gen = torch.Generator().manual_seed(5)
    for scale in (0.05, 0.5, 2.0, 5.0, 10.0, 20.0):
        x = (torch.randn(8, VOCAB, generator=gen) * scale).to(dtype)
        log_p = torch.log(torch.softmax(x, dim=-1)).double()
        exact = x.double() - torch.logsumexp(x.double(), dim=-1, keepdim=True)
        normal = exact >= bound.floor
        half = bound.at(exact) / 2
        deviation = log_p - exact
        highest_low = torch.where(normal, deviation - half, float("-inf")).max(dim=1).values
        lowest_high = torch.where(normal, deviation + half, float("inf")).min(dim=1).values
        assert bool((highest_low <= lowest_high).all()), (dtype, scale)


def test_near_ties_from_full_rows_with_sglangs_own_functions(sglang_hash_patched, tmp_path):
    """The rows the bounds cannot decide go to the full-row sampler; in an engine that is SGLang's own."""
    batch = _near_tie_batches(str(tmp_path / "near_ties.pt"))[0]
    result = kg.sample_keyed_sharded(SingleRankCommunicator(), batch["logits"], vocab_size=batch["vocab"],
                                     temperatures=batch["temperatures"], seeds=batch["seeds"],
                                     positions=batch["positions"], full_row_sampler=kg.sglang_full_row_sampler())
    assert result.full_rows > 0
    assert torch.equal(result.tokens, _sglang_tokens(batch))
