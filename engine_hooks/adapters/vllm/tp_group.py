"""This worker's place in vLLM's TP group, read from vLLM's own group coordinator."""

from __future__ import annotations


def tp_world_size() -> int:
    from vllm.distributed.parallel_state import get_tp_group

    return get_tp_group().world_size


def tp_rank() -> int | None:
    try:
        from vllm.distributed.parallel_state import get_tp_group

        return get_tp_group().rank_in_group
    except Exception:  # before vLLM's groups exist, or outside a worker
        return None
