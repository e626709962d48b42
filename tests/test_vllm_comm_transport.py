"""The vLLM communicator moves every tensor gatherwise sends through vLLM's fast transport exactly: int64 and
float64 payloads as float32 views of their bytes (vLLM's CPU shared-memory ops take floating point only), a
broadcast as an all_gather (they have none). Bit for bit, NaN payloads, infinities and indices past 2^24
included.

Runs without vLLM: `ShmOpsStandIn` stands in for vLLM's `_CPUSHMDistributed` (its argument conventions, and it
refuses what the real ops refuse) and moves the bytes with torch.distributed on real gloo ranks; the group is
a stand-in for vLLM's GroupCoordinator.
"""

from __future__ import annotations

import pytest

from tests._dist import run_ranks


class ShmOpsStandIn:
    """vLLM's CPU shared-memory ops: all_gather_into_tensor and gather, floating point only, no broadcast."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    @staticmethod
    def _check(*tensors) -> None:
        import torch

        for t in tensors:
            if t is not None and t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
                raise TypeError(f"shm ops take floating point, got {t.dtype}")

    def all_gather_into_tensor(self, output, input, group=None) -> None:
        import torch.distributed as dist

        self._check(output, input)
        self.calls.append("all_gather")
        dist.all_gather_into_tensor(output, input, group=group)

    def gather(self, input, gather_list, dst=-1, group=None) -> None:
        import torch.distributed as dist

        self._check(input, *(gather_list or ()))
        self.calls.append("gather")
        dist.gather(input, gather_list, dst=dst, group=group)


def _payloads(rank: int):
    import torch

    floats = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-310, 3.5 + rank], dtype=torch.float64)
    floats.view(torch.int64)[0] = 0x7FF0_0000_0000_0BAD + rank  # a NaN with a payload
    ints = torch.tensor([(1 << 24) + 1, (1 << 53) + 3, -1, 151_935, rank], dtype=torch.int64)
    return floats, ints


def _rank(rank: int, world: int) -> dict:
    from types import SimpleNamespace

    import torch
    import torch.distributed as dist

    from engine_hooks.adapters.vllm_comm import VllmGroupCommunicator

    fast = ShmOpsStandIn()
    group = SimpleNamespace(rank_in_group=rank, world_size=world, ranks=list(range(world)), device_group=None,
                            device_communicator=SimpleNamespace(dist_module=fast),
                            broadcast=lambda t, src: pytest.fail("broadcast must not take the gloo path"))
    comm = VllmGroupCommunicator(group)
    out = {}
    for name, payload in zip(("float64", "int64"), _payloads(rank), strict=True):
        gathered = torch.empty(world, payload.numel(), dtype=payload.dtype)
        comm.all_gather(gathered, payload)
        rooted = torch.empty_like(gathered) if rank == 0 else None
        comm.gather(rooted, payload)
        tokens = payload.clone()
        comm.broadcast(tokens)
        out[name] = {"all_gather": gathered.view(torch.int64).tolist(),
                     "gather": None if rooted is None else rooted.view(torch.int64).tolist(),
                     "broadcast": tokens.view(torch.int64).tolist()}
    # a generator state of 5 bytes has no float32 view: it takes the group's own (gloo) broadcast
    group.broadcast = lambda t, src: dist.broadcast(t, src)
    odd = torch.arange(5, dtype=torch.uint8) + 10 * rank
    comm.broadcast(odd)
    out["odd_bytes"] = odd.tolist()
    dist.barrier()
    return {"results": out, "calls": fast.calls, "transport": comm.transport}


@pytest.mark.timeout(120)
def test_every_payload_crosses_the_fast_transport_bit_for_bit():
    import torch

    results = run_ranks(_rank, 2, timeout=100)
    expected = {name: [p.view(torch.int64).tolist() for p in pair]
                for name, pair in zip(("float64", "int64"), zip(_payloads(0), _payloads(1), strict=True), strict=True)}
    for rank, got in enumerate(results):
        assert got["transport"] == "ShmOpsStandIn"
        assert got["calls"] == ["all_gather", "gather", "all_gather"] * 2  # the broadcast is an all_gather
        for name, ranks in expected.items():
            r = got["results"][name]
            assert r["all_gather"] == ranks
            assert r["gather"] == (ranks if rank == 0 else None)
            assert r["broadcast"] == ranks[0]  # rank 0's tensor on every rank
        assert got["results"]["odd_bytes"] == [0, 1, 2, 3, 4]
