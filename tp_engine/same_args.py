"""Every node parses its own command line. Ranks given other arguments would pair up the wrong collectives (a
hang until the timeout, or wrong results), so a multi-rank run compares a hash of them before its first call."""

from __future__ import annotations

import torch

from gatherwise.engine_hooks.comm import Communicator
from gatherwise.stable_hash import stable_hash


def check_same_args(comm: Communicator, text: str, device: torch.device, what: str) -> None:
    """Raise on every rank unless every rank passed the same `text` (a repr of its run's arguments)."""
    if comm.world_size == 1:
        return
    out = torch.zeros(comm.world_size, 1, dtype=torch.int64, device=device)
    comm.all_gather(out, torch.tensor([stable_hash(text) & ((1 << 63) - 1)], dtype=torch.int64, device=device))
    hashes = [row[0] for row in out.cpu().tolist()]
    differ = [r for r, h in enumerate(hashes) if h != hashes[0]]
    if differ:
        raise RuntimeError(f"ranks {differ} were given other {what} than rank 0: run every node's command with the "
                           "same arguments")
