"""SGLang 0.5.23: `python -m sglang.launch_server` at TP=2 on CPU, driven by `python -m sglang.bench_serving`."""

from __future__ import annotations

import json
from pathlib import Path

from gatherwise.bench.serve.cells import Cell
from gatherwise.bench.serve.client_result import ClientResult, read_sglang_result
from gatherwise.bench.serve.engine_spec import SERVED_MODEL_NAME, EngineSpec, NodeRank, Workload, core_per_rank

# SGLang's CPU engine and no pynccl (its CUDA torch build would load libnccl; a missing path turns that off); the
# SGLang tests run it the same way. Its OpenMP core per rank comes from tp_env, or node_env across nodes.
SGLANG_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "SGLANG_NCCL_SO_PATH": "/nonexistent/libnccl.so"}
# idle OpenMP workers sleep instead of spinning on the core the other rank needs (docs/sglang.md); a caller's
# OMP_WAIT_POLICY wins
SGLANG_ENV_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}
RANDOM_SEED = 1234


class SglangEngine(EngineSpec):
    name = "sglang"
    env = SGLANG_ENV
    shm_leftovers = ("sglang_loads_*", "sgl_shm_mq_*", "sem.mp-*")

    def server_command(self, python: str, model: Path, host: str, port: int, context_len: int,
                       max_total_tokens: int, node: NodeRank | None = None, tp: int = 2) -> list[str]:
        # the engine tests' settings (tests/sglang/engine_run.py ENGINE_ARGS), with room for every running request;
        # --mem-fraction-static must cover the loaded weights (SGLang refuses to start otherwise): a Qwen2.5-0.5B-
        # shaped checkpoint's take about 5.3 % of a 23 GB host's memory, so 0.05 is too little there. The KV cache
        # is bounded by --max-total-tokens whatever the fraction.
        command = [python, "-m", "sglang.launch_server", "--model-path", str(model),
                   "--served-model-name", SERVED_MODEL_NAME, "--host", host, "--port", str(port), "--tp", str(tp),
                   "--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph",
                   "--dtype", "float32", "--mem-fraction-static", "0.15", "--max-total-tokens", str(max_total_tokens),
                   "--context-length", str(context_len),
                   "--random-seed", str(RANDOM_SEED), "--log-level", "warning"]
        if node is not None:
            command += ["--nnodes", str(node.count), "--node-rank", str(node.index),
                        "--dist-init-addr", f"{node.master}:{node.dist_port}"]
        return command

    def node_env(self, node: NodeRank) -> dict[str, str]:
        # SGLANG_HOST_IP: without it SGLang finds its address through a route to a public one, which a node with
        # only its links lacks, and stalls at "Can not get local ip by remote" (docs/deployment.md).
        # SGLANG_CPU_OMP_THREADS_BIND lists a core per local rank: node k's one rank on core k, so the nodes of
        # one host do not share a core.
        return {"SGLANG_HOST_IP": node.address, "SGLANG_CPU_OMP_THREADS_BIND": str(node.index)}

    def env_defaults(self, tp: int) -> dict[str, str]:
        return SGLANG_ENV_DEFAULTS

    def tp_env(self, tp: int) -> dict[str, str]:
        # one OpenMP core per rank, whatever the caller set: its NUMA check wants a core each
        return {"SGLANG_CPU_OMP_THREADS_BIND": core_per_rank(tp)}

    def client_command(self, python: str, model: Path, host: str, port: int, cell: Cell, workload: Workload,
                       result_file: Path, prompts: list[str] | None = None) -> list[str]:
        body = {"temperature": cell.sampling.temperature}
        if not cell.sampling.greedy:
            body["top_p"] = cell.sampling.top_p
        if prompts is None:
            # random-ids: SGLang's random dataset from token ids; its "random" samples ShareGPT text from the hub
            dataset = ["--dataset-name", "random-ids", "--random-input-len", str(workload.input_len),
                       "--random-output-len", str(workload.output_len), "--random-range-ratio", "1.0"]
        else:
            # ShareGPT's format read from a local file: each prompt one conversation's first turn, sent as it is
            # (no --apply-chat-template: the text is already rendered), --sharegpt-output-len tokens out
            path = result_file.with_suffix(".prompts.json")
            path.write_text(json.dumps([{"conversations": [{"from": "human", "value": text},
                                                           {"from": "gpt", "value": ""}]} for text in prompts]))
            dataset = ["--dataset-name", "sharegpt", "--dataset-path", str(path),
                       "--sharegpt-output-len", str(workload.output_len)]
        # ignore_eos is its default, so every request makes exactly the output length asked for
        return [python, "-m", "sglang.bench_serving", "--backend", "sglang-oai", "--host", host,
                "--port", str(port), "--model", str(model), "--served-model-name", SERVED_MODEL_NAME,
                "--tokenizer", str(model), *dataset, "--num-prompts", str(cell.num_prompts),
                "--max-concurrency", str(cell.concurrency), "--request-rate", "inf", "--seed", str(workload.seed),
                "--extra-request-body", json.dumps(body), "--output-file", str(result_file), "--output-details",
                "--disable-tqdm"]

    def read_result(self, result_file: Path) -> ClientResult:
        return read_sglang_result(result_file)
