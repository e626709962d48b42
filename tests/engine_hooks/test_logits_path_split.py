"""LogitsPath.exchange()/complete(): the split call an engine with its own sampler uses (the vLLM adapter).

On real gloo ranks: the engine samples the full logits itself (argmax here) on the ranks that hold them; gather
mode brings rank 0's tokens to every rank; a per-call mode override (non-greedy batches in vLLM) runs
all_gather on every rank; a requested switch is adopted on every rank at the same call in both modes.
"""

from __future__ import annotations

import torch

from tests._dist import run_ranks

BATCHES = [1, 3, 8, 2, 5, 4, 7, 1]
VOCAB = 1000  # shard width 500 with P=2: no padding


def _split_path(rank, world, first_mode):
    from gatherwise.engine_hooks.comm import default_communicator
    from gatherwise.engine_hooks.logged_path import LoggedLogitsPath
    from gatherwise.engine_hooks.table_source import InProcessTableSource
    from gatherwise.modes import Mode, ModeTable

    source = InProcessTableSource()
    path = LoggedLogitsPath(default_communicator(), VOCAB,
                            initial_table=ModeTable.uniform(Mode.parse(first_mode)), table_source=source)
    gen = torch.Generator().manual_seed(9)
    tokens, expected = [], []
    for step, batch in enumerate(BATCHES):
        if step == 3 and rank == 0:  # flip the table while call 3 runs: every rank switches at call 3 + ADOPT_LAG
            source.request(ModeTable.uniform(Mode.GATHER if first_mode == "all_gather" else Mode.ALL_GATHER))
        full = torch.randn(batch, VOCAB, generator=gen)
        expected.append(full.argmax(-1).tolist())
        path.logits_buffer(batch).copy_(full[:, rank * path.width:(rank + 1) * path.width])
        override = Mode.ALL_GATHER if step == 6 else None  # e.g. a batch that is not all-greedy
        mode, shards = path.exchange(mode=override)
        if mode == Mode.ALL_GATHER or rank == 0:
            logits = shards.permute(1, 0, 2).reshape(batch, -1)  # the layout an engine's all_gather gives
            mine = logits.argmax(-1)
            out = path.complete(mine if mode == Mode.GATHER else None, sample_start=1, sample_end=2)
            out = mine if out is None else out
        else:
            out = path.complete(None)
        assert out is not None
        tokens.append(out.tolist())
    return tokens, expected, [m.label for m in path.mode_log], path.epoch


def test_split_call_gives_every_rank_the_tokens_and_one_mode_per_call():
    for first in ("all_gather", "gather"):
        results = run_ranks(_split_path, 2, first, timeout=120)
        other = "gather" if first == "all_gather" else "all_gather"
        want_modes = [first] * 5 + [other] + ["all_gather"] + [other]  # ADOPT_LAG == 2 (test_logits_path.py)
        for tokens, expected, modes, epoch in results:
            assert tokens == expected
            assert modes == want_modes
            assert epoch == 1
