"""One-time install handshake: every rank must run the same hooks, config and initial table.

Each rank contributes a fixed int64 tuple to one all_gather; every rank compares all tuples and raises
the same clear error on any mismatch, so no rank is left waiting in a later collective.
"""

from __future__ import annotations

import torch

from gatherwise import HOOKS_VERSION
from gatherwise.engine_hooks.comm import Communicator
from gatherwise.logits_dtypes import dtype_code
from gatherwise.modes import ModeTable
from gatherwise.stable_hash import stable_hash

INT64_MAX = (1 << 63) - 1  # every field travels as one int64
_FIELDS = ("hooks version", "config hash", "initial table", "vocab", "logits dtype")


class HandshakeError(RuntimeError):
    pass


def handshake(comm: Communicator, *, config_hash: int, table: ModeTable, vocab: int, dtype: torch.dtype,
              device: torch.device | str = "cpu", hooks_version: str = HOOKS_VERSION) -> None:
    """Raise HandshakeError on every rank unless all ranks agree on version, config, table, vocab, dtype."""
    mine = [stable_hash(hooks_version), config_hash & INT64_MAX, table.encode(), vocab, dtype_code(dtype)]
    out = torch.zeros(comm.world_size, len(mine), dtype=torch.int64, device=device)
    comm.all_gather(out, torch.tensor(mine, dtype=torch.int64, device=device))
    rows = out.cpu().tolist()
    problems = [
        f"rank {r} has a different {_FIELDS[i]} than rank 0 ({row[i]} != {rows[0][i]})"
        for r, row in enumerate(rows)
        for i in range(len(mine))
        if row[i] != rows[0][i]
    ]
    if problems:
        raise HandshakeError("gatherwise handshake failed; the TP ranks are not set up alike: " + "; ".join(problems)
                             + f" (this is rank {comm.rank}, hooks {hooks_version})")
