"""What `gatherwise bench serve` needs to know about an engine: how to start its OpenAI-compatible server, how to
run its own benchmark client against it, and what it leaves behind in /dev/shm."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from gatherwise.bench.serve.cells import Cell
from gatherwise.bench.serve.client_result import ClientResult

SERVED_MODEL_NAME = "bench"
LOCAL_HOST = "127.0.0.1"


@dataclass(frozen=True)
class NodeRank:
    """A server start that is node `index` of a TP group spread over `count` nodes, one rank each: rank 0's node
    (the only one that serves HTTP) at `master`, which also serves the group's rendezvous on `dist_port`."""
    index: int
    count: int
    address: str  # this node's own address (what the engine announces to the others)
    master: str
    dist_port: int


@dataclass(frozen=True)
class Workload:
    """What every client run of one benchmark shares: prompt and output lengths, and the dataset seed (the same
    prompts for every configuration)."""
    input_len: int
    output_len: int
    seed: int


class EngineSpec(ABC):
    name: str
    env: dict[str, str]  # the CPU settings the engine tests use
    shm_leftovers: tuple[str, ...]  # /dev/shm names (globs) the engine may leave when it kills its own workers

    @abstractmethod
    def server_command(self, python: str, model: Path, host: str, port: int, context_len: int,
                       max_total_tokens: int, node: NodeRank | None = None, tp: int = 2) -> list[str]:
        """The engine's OpenAI-compatible server at TP=`tp` on `host`:`port`: requests of up to `context_len`
        tokens, room for `max_total_tokens` in the KV cache where the engine asks. With `node`, this node's share of
        a group across nodes, one rank per node (node 0 serves HTTP; the others run their ranks only)."""

    def env_defaults(self, tp: int) -> dict[str, str]:
        """What a CPU host runs the engine with at TP=`tp` unless the caller set it."""
        return {}

    def tp_env(self, tp: int) -> dict[str, str]:
        """What a server at TP=`tp` sets on top of `env` (the engine's per-rank CPU settings)."""
        return {}

    def node_env(self, node: NodeRank) -> dict[str, str]:
        """What node `node` of a group across nodes sets on top of `env`."""
        raise NotImplementedError(f"{self.name} does not run across nodes here")

    @abstractmethod
    def client_command(self, python: str, model: Path, host: str, port: int, cell: Cell, workload: Workload,
                       result_file: Path, prompts: list[str] | None = None) -> list[str]:
        """The engine's own benchmark client for one cell against `host`:`port`, writing its JSON result to
        `result_file`: on the engine's random dataset, or on `prompts` (rendered text, one request each, sent as
        they are) written next to `result_file` in the engine's dataset format."""

    @abstractmethod
    def read_result(self, result_file: Path) -> ClientResult:
        """The client's result file, normalized."""


def core_per_rank(tp: int) -> str:
    """An OpenMP core list per rank in the engines' `A|B|...` form: rank r on the r-th core this process may run on
    (a container's cpuset need not start at core 0), ranks past those cores sharing them from the first again."""
    cores = sorted(os.sched_getaffinity(0))
    return "|".join(str(cores[rank % len(cores)]) for rank in range(tp))
