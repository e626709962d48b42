"""What `gatherwise bench serve` needs to know about an engine: how to start its OpenAI-compatible server, how to
run its own benchmark client against it, and what it leaves behind in /dev/shm."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from gatherwise.bench.serve.cells import Cell
from gatherwise.bench.serve.client_result import ClientResult

SERVED_MODEL_NAME = "bench"


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
    env_defaults: ClassVar[dict[str, str]] = {}  # what the engine's docs give a CPU host, unless the caller set it
    shm_leftovers: tuple[str, ...]  # /dev/shm names (globs) the engine may leave when it kills its own workers

    @abstractmethod
    def server_command(self, python: str, model: Path, port: int, context_len: int, max_total_tokens: int
                       ) -> list[str]:
        """The engine's OpenAI-compatible server at TP=2 on 127.0.0.1:`port`: requests of up to `context_len`
        tokens, room for `max_total_tokens` in the KV cache where the engine asks."""

    @abstractmethod
    def client_command(self, python: str, model: Path, port: int, cell: Cell, workload: Workload,
                       result_file: Path) -> list[str]:
        """The engine's own benchmark client for one cell, writing its JSON result to `result_file`."""

    @abstractmethod
    def read_result(self, result_file: Path) -> ClientResult:
        """The client's result file, normalized."""
