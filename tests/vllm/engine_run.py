"""One vLLM engine (TP=2 on CPU, tiny Llama) in its own process; prints one JSON object on its last line.

`python -m tests.vllm.engine_run --model DIR [--shm-dir DIR --sidecar URL --token T]`
The plugin is switched by the environment this process gets (GATHERWISE_ENABLE, GATHERWISE_ENGINE_*).

Phases, all with token prompts of different lengths and output lengths (so the batch shrinks and several
buckets occur):
- greedy: LLM.generate with temperature 0.
- seeded: random sampling with a seed per request (top-p): gather mode samples it on rank 0, sharded runs all_gather.
- switched (with --sidecar): the engine is stepped by hand (in-process engine core) and the mode is flipped
  through the sidecar's HTTP API (PUT /v1/mode) between steps: gather, all_gather, gather again.
  Then the sidecar's /metrics and /v1/mode, and every rank's ring (call_index -> mode), are collected while
  the engine still runs.
- three-mode switches (with --control-switch): the same stepping, the mode flipped between steps by writing
  the engine's real control block (gatherwise.sidecar.control.block_client, what the sidecar itself writes):
  gather, sharded, all_gather, sharded.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from tests._engine_harness import engine_run_arguments, http, read_rings

if TYPE_CHECKING:
    from vllm import LLM, RequestOutput

PROMPTS = [[1, 15, 27, 99, 4000, 12], [7, 8], [31000, 5, 5, 5, 17, 23, 29, 31, 37], [2], [900, 901, 902, 903],
           [12345, 54321, 11]]
MAX_TOKENS = [24, 16, 20, 12, 24, 8]


def token_ids(outputs: list[RequestOutput]) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]  # LLM.generate keeps the order of the prompts


def run_switched(llm: LLM, sidecar: str, token: str) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine = llm.llm_engine
    for i, (prompt, n) in enumerate(zip(PROMPTS, MAX_TOKENS, strict=True)):
        engine.add_request(f"sw-{i}", TokensPrompt(prompt_token_ids=prompt),
                           SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False))
    outputs, step, puts = {}, 0, []
    plan = {3: "gather", 9: "all_gather", 14: "gather"}  # step -> mode to ask for before it
    deadline = time.monotonic() + 60
    while engine.has_unfinished_requests():
        if step in plan:
            status = 0
            while status != 200 and time.monotonic() < deadline:  # the sidecar attaches once the hooks exist
                status, _ = http("GET", f"{sidecar}/v1/mode")
                if status != 200:
                    time.sleep(0.05)
            code, body = http("PUT", f"{sidecar}/v1/mode?wait=0", {"mode": plan[step]}, token)
            puts.append({"step": step, "mode": plan[step], "status": code, "body": json.loads(body)})
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = list(out.outputs[0].token_ids)
        step += 1
    time.sleep(1.0)  # let the sidecar ingest the last records before reading its metrics
    _, metrics = http("GET", f"{sidecar}/metrics")
    code, mode = http("GET", f"{sidecar}/v1/mode")
    return {"tokens": [outputs[f"sw-{i}"] for i in range(len(PROMPTS))], "puts": puts, "steps": step,
            "metrics": metrics, "mode": json.loads(mode) if code == 200 else None}


def run_control_switched(llm: LLM, shm_dir: str) -> dict:
    """Greedy requests stepped by hand; the table is flipped across all three modes through the control block."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from gatherwise.modes import Mode, ModeTable
    from gatherwise.sidecar.control.block_client import ControlClient
    from gatherwise.sidecar.ingest.ring_reader import discover_engines

    engine = llm.llm_engine
    for i, (prompt, n) in enumerate(zip(PROMPTS, MAX_TOKENS, strict=True)):
        engine.add_request(f"cs-{i}", TokensPrompt(prompt_token_ids=prompt),
                           SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False))
    plan = {2: Mode.GATHER, 6: Mode.SHARDED, 10: Mode.ALL_GATHER, 14: Mode.SHARDED}  # step -> mode before it
    outputs, step, applied = {}, 0, []
    client = None
    while engine.has_unfinished_requests():
        if step in plan:
            if client is None:
                control = discover_engines(shm_dir)[0].control
                if control is None:
                    raise RuntimeError(f"the engine in {shm_dir} has no control block to write commands to")
                client = ControlClient(control)
            applied.append({"step": step, "mode": plan[step].label,
                            "seq": client.write_command(ModeTable.uniform(plan[step]))})
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = list(out.outputs[0].token_ids)
        step += 1
    return {"tokens": [outputs[f"cs-{i}"] for i in range(len(PROMPTS))], "commands": applied, "steps": step}


def main() -> None:
    p = engine_run_arguments()
    p.add_argument("--control-switch", action="store_true")
    args = p.parse_args()

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=args.model, tensor_parallel_size=2, enforce_eager=True, max_model_len=256,
              distributed_executor_backend="mp", skip_tokenizer_init=True, seed=0)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in PROMPTS]
    greedy = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False) for n in MAX_TOKENS]
    seeded = [SamplingParams(temperature=0.8, top_p=0.9, seed=100 + i, max_tokens=n, ignore_eos=True,
                             detokenize=False) for i, n in enumerate(MAX_TOKENS)]
    result: dict[str, object] = {"greedy": token_ids(llm.generate(prompts, greedy, use_tqdm=False)),
              "seeded": token_ids(llm.generate(prompts, seeded, use_tqdm=False))}
    if args.sidecar:
        result["switched"] = run_switched(llm, args.sidecar, args.token)
    if args.control_switch:
        result["control_switched"] = run_control_switched(llm, args.shm_dir)
    if args.shm_dir:
        result["rings"] = read_rings(args.shm_dir)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
