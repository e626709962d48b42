"""The vLLM and SGLang communicators move every tensor gatherwise sends through the engine's CPU shared-memory
collectives exactly: int64 and float64 payloads as float32 views of their bytes (the ops take floating point
only), a broadcast as an all_gather (they have none). Bit for bit, NaN payloads, infinities and indices past
2^24 included.

Runs without vLLM or SGLang: `ShmOpsStandIn` stands in for vLLM's `_CPUSHMDistributed` and
`sglang_shm_allgather_stand_in` for SGLang's `sgl_kernel.shm_allgather` (their argument conventions, and they
refuse what the real ops refuse), moving the bytes with torch.distributed on real gloo ranks; the groups are
stand-ins for the engines' GroupCoordinators. No machine here runs the real ops (vLLM's need a shared SHM group
name and an AVX-512 CPU, SGLang's AMX or arm64).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests._dist import run_ranks

if TYPE_CHECKING:  # imported where used: the ranks import torch and the adapters, this module does not
    import torch
    import torch.distributed as dist

    from gatherwise.engine_hooks.adapters.sglang.comm import SglangGroupCommunicator, ShmAllGather
    from gatherwise.engine_hooks.adapters.vllm.comm import VllmGroupCommunicator


class ShmOpsStandIn:
    """vLLM's CPU shared-memory ops: all_gather_into_tensor and gather, floating point only, no broadcast."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    @staticmethod
    def _check(*tensors: torch.Tensor | None) -> None:
        import torch

        for t in tensors:
            if t is not None and t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
                raise TypeError(f"shm ops take floating point, got {t.dtype}")

    def all_gather_into_tensor(self, output: torch.Tensor, input: torch.Tensor,
                               group: dist.ProcessGroup | None = None) -> None:
        import torch.distributed as dist

        self._check(output, input)
        self.calls.append("all_gather")
        dist.all_gather_into_tensor(output, input, group=group)

    def gather(self, input: torch.Tensor, gather_list: list[torch.Tensor] | None, dst: int = -1,
               group: dist.ProcessGroup | None = None) -> None:
        import torch.distributed as dist

        self._check(input, *(gather_list or ()))
        self.calls.append("gather")
        dist.gather(input, gather_list, dst=dst, group=group)


def _payloads(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    floats = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-310, 3.5 + rank], dtype=torch.float64)
    floats.view(torch.int64)[0] = 0x7FF0_0000_0000_0BAD + rank  # a NaN with a payload
    ints = torch.tensor([(1 << 24) + 1, (1 << 53) + 3, -1, 151_935, rank], dtype=torch.int64)
    return floats, ints


def sglang_shm_allgather_stand_in(calls: list[str]) -> ShmAllGather:
    def shm_allgather(inp, dim):
        import torch
        import torch.distributed as dist

        ShmOpsStandIn._check(inp)
        assert dim == 0 and inp.dim() == 1
        calls.append("all_gather")
        out = torch.empty(dist.get_world_size() * inp.numel(), dtype=inp.dtype)
        dist.all_gather_into_tensor(out, inp)
        return out

    return shm_allgather


def _rank(rank: int, world: int, engine: str) -> dict:
    from types import SimpleNamespace

    import torch
    import torch.distributed as dist

    def refused(*args, **kwargs):
        raise AssertionError("the group's own (gloo) collective was called")

    comm: VllmGroupCommunicator | SglangGroupCommunicator
    calls: list[str]
    group = SimpleNamespace(rank_in_group=rank, world_size=world, ranks=list(range(world)), device_group=None,
                            broadcast=refused, all_gather_into_tensor=refused)
    if engine == "vllm":
        from gatherwise.engine_hooks.adapters.vllm.comm import VllmGroupCommunicator

        fast = ShmOpsStandIn()
        group.device_communicator = SimpleNamespace(dist_module=fast)
        comm, calls = VllmGroupCommunicator(group), fast.calls
    else:
        from gatherwise.engine_hooks.adapters.sglang.comm import SglangGroupCommunicator

        calls = []
        comm = SglangGroupCommunicator(group, shm_allgather=sglang_shm_allgather_stand_in(calls))
    out: dict[str, object] = {}
    for name, payload in zip(("float64", "int64"), _payloads(rank), strict=True):
        gathered = torch.empty(world, payload.numel(), dtype=payload.dtype)
        comm.all_gather(gathered, payload)
        rooted = torch.empty_like(gathered) if rank == 0 else None
        comm.gather(rooted, payload)  # SGLang: torch.distributed.gather, as SGLang's own gather
        tokens = payload.clone()
        comm.broadcast(tokens)
        out[name] = {"all_gather": gathered.view(torch.int64).tolist(),
                     "gather": None if rooted is None else rooted.view(torch.int64).tolist(),
                     "broadcast": tokens.view(torch.int64).tolist()}
    # a generator state of 5 bytes has no float32 view: it takes the group's own (gloo) broadcast
    group.broadcast = dist.broadcast
    odd = torch.arange(5, dtype=torch.uint8) + 10 * rank
    comm.broadcast(odd)
    out["odd_bytes"] = odd.tolist()
    dist.barrier()
    return {"results": out, "calls": calls, "transport": comm.transport}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_payload_crosses_the_fast_transport_bit_for_bit(engine):
    import torch

    results = run_ranks(_rank, 2, engine, timeout=100)
    expected = {name: [p.view(torch.int64).tolist() for p in pair]
                for name, pair in zip(("float64", "int64"), zip(_payloads(0), _payloads(1), strict=True), strict=True)}
    for rank, got in enumerate(results):
        if engine == "vllm":
            assert got["transport"] == "ShmOpsStandIn"
            assert got["calls"] == ["all_gather", "gather", "all_gather"] * 2  # the broadcast is an all_gather
        else:
            assert got["transport"] == "sgl_kernel.shm_allgather"
            assert got["calls"] == ["all_gather", "all_gather"] * 2
        for name, ranks in expected.items():
            r = got["results"][name]
            assert r["all_gather"] == ranks
            assert r["gather"] == (ranks if rank == 0 else None)
            assert r["broadcast"] == ranks[0]  # rank 0's tensor on every rank
        assert got["results"]["odd_bytes"] == [0, 1, 2, 3, 4]
