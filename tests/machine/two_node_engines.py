"""The engines tests.machine.two_node runs across its two nodes: how node k starts, when the group is ready, and how
one batched greedy request is sent to node 0 (rank 0's node, the only one that serves HTTP)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from gatherwise.bench.netns_nodes import address, http
from gatherwise.bench.serve.engine_spec import SERVED_MODEL_NAME
from gatherwise.bench.serve.node_servers import DIST_PORT, ENGINE_PORT, node_rank
from gatherwise.bench.serve.sglang_engine import SGLANG_ENV, SGLANG_ENV_DEFAULTS, SglangEngine
from gatherwise.bench.serve.vllm_engine import VLLM_ENV, VllmEngine
from tests._repo import ROOT


@dataclass(frozen=True)
class Engine:
    name: str
    venv: str

    @property
    def python(self) -> str:
        return str(ROOT / self.venv / "bin" / "python")

    @property
    def gatherwise(self) -> str:
        return str(ROOT / self.venv / "bin" / "gatherwise")

    def url(self, path: str) -> str:
        return f"http://{address(0)}:{ENGINE_PORT}{path}"

    def env(self, node: int) -> dict[str, str]:
        raise NotImplementedError

    def command(self, node: int, model: str) -> list[str]:
        raise NotImplementedError

    def health_path(self) -> str:
        raise NotImplementedError

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        raise NotImplementedError

    def ready(self) -> bool:
        return http(0, "GET", self.url(self.health_path()), timeout=10)[0] == 200

    def post(self, path: str, body: dict) -> dict | list:
        code, text = http(0, "POST", self.url(path), body, timeout=300)
        if code != 200:
            raise RuntimeError(f"{self.name} {path} answered {code}: {text[:300]}")
        return json.loads(text)


class SGLang(Engine):
    """`launch_server --nnodes 2 --node-rank k`, as `gatherwise bench serve --nodes 2` starts it (its settings and
    each node's environment live there), taking token ids (no tokenizer)."""

    SPEC = SglangEngine()

    def env(self, node: int) -> dict[str, str]:
        return {**SGLANG_ENV, **SGLANG_ENV_DEFAULTS, **self.SPEC.node_env(node_rank(node))}

    def command(self, node: int, model: str) -> list[str]:
        return [*self.SPEC.server_command(self.python, Path(model), address(node), ENGINE_PORT, context_len=256,
                                          max_total_tokens=4096, node=node_rank(node)), "--skip-tokenizer-init"]

    def health_path(self) -> str:
        return "/health_generate"

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        """The prompts as one batched request (a list of prompts): steps of len(prompts) rows."""
        out = self.post("/generate", {"input_ids": prompts, "sampling_params": {
            "temperature": 0.0, "max_new_tokens": max_tokens, "ignore_eos": True}})
        return [o["output_ids"] for o in out]


class Vllm(Engine):
    """`vllm serve --nnodes 2 --node-rank k --master-addr <node 0>` (mp backend), as `gatherwise bench serve --nodes
    2` starts it (its settings and each node's environment live there); node 1 is `--headless`: it runs its rank
    only, no API server. Takes token ids (no tokenizer)."""

    SPEC = VllmEngine()

    def env(self, node: int) -> dict[str, str]:
        return {**VLLM_ENV, **self.SPEC.node_env(node_rank(node))}

    def command(self, node: int, model: str) -> list[str]:
        return [*self.SPEC.server_command(self.python, Path(model), address(node), ENGINE_PORT, context_len=256,
                                          max_total_tokens=4096, node=node_rank(node)), "--skip-tokenizer-init"]

    def health_path(self) -> str:
        return "/health"

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        """The prompts as one completions request (a list of prompts): vLLM schedules them into the same steps."""
        out = self.post("/v1/completions", {"model": SERVED_MODEL_NAME, "prompt": prompts, "max_tokens": max_tokens,
                                            "temperature": 0.0, "return_token_ids": True, "ignore_eos": True})
        assert isinstance(out, dict)
        return [c["token_ids"] for c in sorted(out["choices"], key=lambda c: c["index"])]


class Reference(Engine):
    """gatherwise's own engine: `gatherwise engine` (a synthetic decode load, 4 greedy rows a step, hooks on) for
    the sidecars, and `gatherwise generate` across the nodes for tokens. It serves no HTTP: a round is time."""

    ROUND_S = 3.0

    def env(self, node: int) -> dict[str, str]:
        return {}

    def node_args(self, node: int) -> list[str]:
        return ["--tp", "2", "--nnodes", "2", "--node-rank", str(node), "--dist-init-addr",
                f"{address(0)}:{DIST_PORT}"]

    def command(self, node: int, model: str) -> list[str]:
        return [self.gatherwise, "engine", *self.node_args(node), "--workload", "fixed:4"]

    def generate_command(self, node: int, prompts: list[list[int]], max_tokens: int, mode: str) -> list[str]:
        ids = [arg for p in prompts for arg in ("--prompt-ids", ",".join(map(str, p)))]
        return [self.gatherwise, "generate", *self.node_args(node), *ids, "--max-new-tokens", str(max_tokens),
                "--ignore-eos", "--mode", mode, "--json", "--timeout", "300"]

    def sweep_command(self, node: int, out: str, rows: str) -> list[str]:
        """`gatherwise bench` across the nodes: greedy, float32, Llama's and Qwen2's vocab; node 0 writes `out`."""
        return [self.gatherwise, "bench", *self.node_args(node), "--rows", rows, "--vocab", "32000,152064",
                "--dtype", "float32", "--iters", "20", "--out", out, "--timeout", "1500"]

    def ready(self) -> bool:
        return True  # `gatherwise engine` runs as soon as both nodes joined; the sidecars say when they see it

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        time.sleep(self.ROUND_S)
        return []


ENGINES = {"sglang": SGLang("sglang", ".venv-sglang"), "vllm": Vllm("vllm", ".venv-vllm"),
           "reference": Reference("reference", ".venv")}

