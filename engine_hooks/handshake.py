"""One-time install handshake: every rank must run the same hooks, config and initial table.

Each rank contributes a fixed int64 tuple to one all_gather; every rank compares all tuples and raises
the same clear error on any mismatch, so no rank is left waiting in a later collective.
"""

from __future__ import annotations

import hashlib

import torch

from engine_hooks.comm import Communicator
from gatherwise import HOOKS_VERSION
from gatherwise.modes import ModeTable

_FIELDS = ("hooks version", "config hash", "initial table", "vocab", "logits dtype")
_DTYPE_CODES = {torch.float32: 1, torch.bfloat16: 2, torch.float16: 3}


class HandshakeError(RuntimeError):
    pass


def stable_hash(text: str) -> int:
    """A 63-bit hash that is the same in every process (unlike hash())."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def handshake(comm: Communicator, *, config_hash: int, table: ModeTable, vocab: int, dtype: torch.dtype,
              device: torch.device | str = "cpu", hooks_version: str = HOOKS_VERSION) -> None:
    """Raise HandshakeError on every rank unless all ranks agree on version, config, table, vocab, dtype."""
    mine = [stable_hash(hooks_version), config_hash & (2**63 - 1), table.encode(), vocab, _DTYPE_CODES[dtype]]
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
