"""The server configurations `gatherwise bench serve` compares, each a separate server start, and the order they
run in."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Configuration:
    name: str
    plugin: bool  # GATHERWISE_ENABLE=1: gatherwise's hooks in the engine, with a real sidecar next to it
    initial_mode: str = "all_gather"  # GATHERWISE_ENGINE_INITIAL_MODE: the table every rank starts with
    auto: bool = False  # the sidecar's auto policy (PUT /v1/mode {"mode": "auto"}) before the warm-up rounds
    sampler: str = "engine"  # GATHERWISE_ENGINE_SAMPLER: who samples sampled batches (engine | gatherwise)

    def environment(self, shm_dir: str) -> dict[str, str]:
        """The GATHERWISE_* variables a server start of this configuration gets (none without the plugin)."""
        if not self.plugin:
            return {}
        return {"GATHERWISE_ENABLE": "1", "GATHERWISE_ENGINE_SHM_DIR": shm_dir,
                "GATHERWISE_ENGINE_INITIAL_MODE": self.initial_mode, "GATHERWISE_ENGINE_SAMPLER": self.sampler}

    @property
    def about(self) -> str:
        if not self.plugin:
            return "the engine without gatherwise (plugin off)"
        drawn_by = " (sampled batches drawn by gatherwise's sampler)" if self.sampler == "gatherwise" else ""
        if self.auto:
            return f"gatherwise, the sidecar's auto policy (on from the warm-up rounds, which it learns in){drawn_by}"
        if self.sampler == "gatherwise":
            return (f"gatherwise pinned to {self.initial_mode}, sampled batches drawn by gatherwise's sampler "
                    "(engine.sampler: gatherwise) in that mode")
        if self.initial_mode == "all_gather":
            return "gatherwise pinned to all_gather: the engine's own collective plus recording (telemetry only)"
        return f"gatherwise pinned to {self.initial_mode}"


CONFIGURATIONS = {c.name: c for c in (
    Configuration("plain", plugin=False),
    Configuration("all_gather", plugin=True),
    Configuration("gather", plugin=True, initial_mode="gather"),
    Configuration("sharded", plugin=True, initial_mode="sharded"),
    Configuration("auto", plugin=True, auto=True),
    # opt-in: sampled batches run sharded too, their tokens from gatherwise's sampler (docs/sglang.md, docs/vllm.md)
    Configuration("sharded+gw-sampler", plugin=True, initial_mode="sharded", sampler="gatherwise"),
    Configuration("auto+gw-sampler", plugin=True, auto=True, sampler="gatherwise"),
)}
# What a configuration list left out means: every configuration whose tokens are the engine's own.
DEFAULT_CONFIGURATIONS = tuple(name for name, c in CONFIGURATIONS.items() if c.sampler == "engine")
BASELINE = "plain"
QUICK_CONFIGURATIONS = ("plain", "gather")


def interleaved(names: list[str], passes: int) -> list[str]:
    """A B C, then C B A, then A B C ...: drift of a shared machine over the run hits every configuration alike,
    so it cannot pick a winner."""
    order: list[str] = []
    for i in range(passes):
        order += names if i % 2 == 0 else names[::-1]
    return order
