"""The engines scripts/two_node.py runs across its two nodes: how node k starts, when the group is ready, and how
one batched greedy request is sent to node 0 (rank 0's node, the only one that serves HTTP)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from gatherwise.bench.netns_nodes import address, http, veth

REPO = Path(__file__).resolve().parent.parent
ENGINE_PORT, DIST_PORT = 30000, 29500


@dataclass(frozen=True)
class Engine:
    name: str
    venv: str

    @property
    def python(self) -> str:
        return str(REPO / self.venv / "bin" / "python")

    @property
    def gatherwise(self) -> str:
        return str(REPO / self.venv / "bin" / "gatherwise")

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
    """`launch_server --nnodes 2 --node-rank k`; SGLANG_HOST_IP is the node's address: without it SGLang looks for
    its address through a route to a public one, which a namespace with only a veth lacks, and stalls at "Can not
    get local ip by remote". SGLANG_CPU_OMP_THREADS_BIND indexes the node's local ranks."""

    def env(self, node: int) -> dict[str, str]:
        return {"SGLANG_USE_CPU_ENGINE": "1", "SGLANG_CPU_OMP_THREADS_BIND": str(node),
                "SGLANG_NCCL_SO_PATH": "/nonexistent/libnccl.so", "OMP_WAIT_POLICY": "PASSIVE",
                "SGLANG_HOST_IP": address(node)}

    def command(self, node: int, model: str) -> list[str]:
        return [self.python, "-m", "sglang.launch_server", "--model-path", model, "--tp", "2", "--nnodes", "2",
                "--node-rank", str(node), "--dist-init-addr", f"{address(0)}:{DIST_PORT}", "--host", address(node),
                "--port", str(ENGINE_PORT), "--device", "cpu", "--attention-backend", "torch_native",
                "--disable-cuda-graph", "--dtype", "float32", "--mem-fraction-static", "0.15",
                "--max-total-tokens", "4096", "--context-length", "256", "--skip-tokenizer-init",
                "--random-seed", "1234", "--log-level", "warning"]

    def health_path(self) -> str:
        return "/health_generate"

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        """The prompts as one batched request (a list of prompts): steps of len(prompts) rows."""
        out = self.post("/generate", {"input_ids": prompts, "sampling_params": {
            "temperature": 0.0, "max_new_tokens": max_tokens, "ignore_eos": True}})
        return [o["output_ids"] for o in out]


class Vllm(Engine):
    """`vllm serve --nnodes 2 --node-rank k --master-addr <node 0>` (mp backend); node 1 is `--headless`: it runs
    its rank only, no API server. VLLM_HOST_IP is the node's address (vLLM, too, would look for it through a
    route to a public address)."""

    def env(self, node: int) -> dict[str, str]:
        return {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_HOST_IP": address(node)}

    def command(self, node: int, model: str) -> list[str]:
        cmd = [self.python, str(REPO / "scripts" / "vllm_serve.py"), model, "--served-model-name", "tiny",
               "--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", str(node),
               "--master-addr", address(0), "--master-port", str(DIST_PORT), "--distributed-executor-backend", "mp",
               "--enforce-eager", "--max-model-len", "256", "--skip-tokenizer-init", "--seed", "0"]
        return cmd + (["--host", address(0), "--port", str(ENGINE_PORT)] if node == 0 else ["--headless"])

    def health_path(self) -> str:
        return "/health"

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        """The prompts as one completions request (a list of prompts): vLLM schedules them into the same steps."""
        out = self.post("/v1/completions", {"model": "tiny", "prompt": prompts, "max_tokens": max_tokens,
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

    def ready(self) -> bool:
        return True  # `gatherwise engine` runs as soon as both nodes joined; the sidecars say when they see it

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        time.sleep(self.ROUND_S)
        return []


ENGINES = {"sglang": SGLang("sglang", ".venv-sglang"), "vllm": Vllm("vllm", ".venv-vllm"),
           "reference": Reference("reference", ".venv")}


def gloo_env(node: int) -> dict[str, str]:
    """gloo's sockets on the veth: both engines' process groups are gloo on CPU."""
    return {"GLOO_SOCKET_IFNAME": veth(node)}
