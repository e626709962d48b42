"""One vLLM engine (TP=2 on CPU, the tiny Llama with its BPE tokenizer, or a trained model at its TP) in its own
process: structured outputs, sampled, seeded, mixed and logprob requests; prints one JSON object on its last line.

`python -m tests.vllm.sampled_run --model DIR [--tp N --shm-dir DIR --switch]`

The same requests run in ROUNDS rounds. With --switch (the plugin on), each round starts by setting the table
through the engine's real control block (sidecar.control_block_client, what the sidecar writes) to that round's mode,
and its stepped phase flips the mode between steps. The plain engine runs the same rounds unchanged, so every
random generator of both engines follows the same calls: each round's tokens must be identical, bit for bit.

Each round, in order:
- structured: greedy requests constrained by a regex, a choice and a JSON schema (LLM.generate);
- sampled (temperature 0.8, top-p 0.9, no seed: torch's default generator), seeded (a seed per request),
  keyed (temperature only, half seeded), penalized (temperature with presence and repetition penalties), mixed
  (greedy and sampled rows in one batch), logprobs (sampled, 3 logprobs per token), prompt logprobs;
- stepped: greedy, sampled, seeded, top-k and logprob requests together, added to the in-process engine core
  and stepped one model step at a time (what a streaming server does), with the mode flipped mid-generation
  (FLIPS); stepped_keyed: greedy, temperature-only and penalized requests the same way; stepped_structured:
  the same with structured-output requests among greedy ones.
Phase boundaries are the control block's call index (rank 0's heartbeat), so the test can tell which calls
served which phase.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from tests._engine_harness import Control, engine_run_arguments, http, read_rings

if TYPE_CHECKING:
    from vllm import LLM, RequestOutput
    from vllm.v1.worker.worker_base import WorkerBase

ROUNDS = ("all_gather", "gather", "sharded")  # the plugin's table in each round
FLIPS = {1: "gather", 4: "sharded", 6: "all_gather", 8: "gather", 11: "all_gather", 13: "gather"}  # step -> mode
PROMPTS = ["the quick brown fox", "tensor parallel serving", "each rank holds a shard", "gather sends every",
           "what is the capital of"]
REGEX, CHOICE = "[0-9]{4}", ["alpha", "beta", "gamma"]
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
          "additionalProperties": False}


def structured_params():
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    kinds = [StructuredOutputsParams(regex=REGEX), StructuredOutputsParams(choice=CHOICE),
             StructuredOutputsParams(json=SCHEMA)]
    return [SamplingParams(temperature=0.0, max_tokens=24, structured_outputs=kinds[i % 3])
            for i in range(len(PROMPTS))]


def phase_params() -> dict[str, list]:
    from vllm import SamplingParams

    n = len(PROMPTS)
    sampled = dict(temperature=0.8, top_p=0.9, max_tokens=12, ignore_eos=True)
    return {
        "structured": structured_params(),
        "greedy": [SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True) for _ in range(n)],
        "sampled": [SamplingParams(**sampled) for _ in range(n)],
        "seeded": [SamplingParams(**sampled, seed=100 + i) for i in range(n)],
        # temperature only, half of them seeded: Model Runner V2 samples these on the shards
        "keyed": [SamplingParams(temperature=0.8, max_tokens=8, ignore_eos=True, seed=200 + i if i % 2 else None)
                  for i in range(n)],
        "penalized": [SamplingParams(temperature=0.8, max_tokens=8, ignore_eos=True, seed=300 + i,
                                     presence_penalty=0.5, repetition_penalty=1.2) for i in range(n)],
        "mixed": [SamplingParams(temperature=0.0 if i % 2 else 0.9, top_k=20, max_tokens=10, ignore_eos=True)
                  for i in range(n)],
        "logprobs": [SamplingParams(**sampled, logprobs=3) for _ in range(n)],
        "prompt_logprobs": [SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=2, ignore_eos=True)
                            for _ in range(n)],
    }


def stepped_params() -> dict[str, list]:
    """Two stepped phases. Their batches must be the same in both engines: a structured-output request waits for
    its grammar to compile (in a thread of vLLM's scheduler), so the step it joins depends on timing, and with it
    the batch size the other rows' random draws see. So structured requests step with greedy ones only."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    sampled = dict(temperature=0.8, top_p=0.9, max_tokens=16, ignore_eos=True)
    greedy = dict(temperature=0.0, max_tokens=16)
    return {"stepped": [SamplingParams(**greedy, ignore_eos=True), SamplingParams(**sampled),
                        SamplingParams(**sampled, seed=7), SamplingParams(**sampled, top_k=5, logprobs=2),
                        SamplingParams(**sampled, logprobs=2)],
            # what Model Runner V2 samples on the shards: greedy, temperature (seeded or not), penalties
            "stepped_keyed": [SamplingParams(**greedy, ignore_eos=True), SamplingParams(temperature=0.8, max_tokens=16,
                              ignore_eos=True), SamplingParams(temperature=0.8, max_tokens=16, ignore_eos=True, seed=7),
                              SamplingParams(temperature=0.8, max_tokens=16, ignore_eos=True, presence_penalty=0.5),
                              SamplingParams(temperature=0.7, max_tokens=12, ignore_eos=True, seed=9)],
            "stepped_structured": [SamplingParams(**greedy, ignore_eos=True),
                                   *(SamplingParams(**greedy, structured_outputs=kind) for kind in (
                                       StructuredOutputsParams(regex=REGEX), StructuredOutputsParams(choice=CHOICE),
                                       StructuredOutputsParams(json=SCHEMA))),
                                   SamplingParams(**greedy, ignore_eos=True)]}


def summary(output: RequestOutput) -> dict:
    """What must match between engines: the text, the token ids and the sampled tokens' logprobs."""
    out = output.outputs[0]
    result = {"text": out.text, "ids": list(out.token_ids)}
    if out.logprobs is not None:
        result["logprobs"] = [{str(t): lp.logprob for t, lp in step.items()} for step in out.logprobs]
    if output.prompt_logprobs is not None:
        result["prompt_logprobs"] = [None if step is None else {str(t): lp.logprob for t, lp in step.items()}
                                     for step in output.prompt_logprobs]
    return result


def run_stepped(llm: LLM, control: Control | None, name: str, params: list) -> tuple[list[dict], list[dict]]:
    from vllm.inputs import TextPrompt

    engine = llm.llm_engine
    for i, (prompt, p) in enumerate(zip(PROMPTS, params, strict=True)):
        engine.add_request(f"{name}-{i}", TextPrompt(prompt=prompt), p)
    outputs, flips, step = {}, [], 0
    while engine.has_unfinished_requests():
        if control is not None and step in FLIPS and control.set(FLIPS[step]):
            flips.append({"step": step, "mode": FLIPS[step], "call_index": control.call_index()})
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = summary(out)
        step += 1
    return [outputs[f"{name}-{i}"] for i in range(len(PROMPTS))], flips


def runner_class(worker: WorkerBase) -> str:
    """The model runner a worker built, and its base (LLM.collective_rpc; VLLM_ALLOW_INSECURE_SERIALIZATION=1
    lets a function travel to the workers)."""
    cls = type(worker.model_runner)
    return f"{cls.__module__}.{cls.__qualname__} < {cls.__mro__[1].__module__}.{cls.__mro__[1].__qualname__}"


def sidecar_answers(url: str) -> dict:
    _, engine = http("GET", f"{url}/v1/engine")
    ready_status, _ = http("GET", f"{url}/readyz")
    _, live = http("GET", f"{url}/v1/live")
    return {"engine": json.loads(engine), "readyz": ready_status, "live": json.loads(live)}


def main() -> None:
    p = engine_run_arguments()
    p.add_argument("--switch", action="store_true")
    p.add_argument("--rounds", default=",".join(ROUNDS), help="the rounds' modes (all by default)")
    p.add_argument("--phases", help="only these offline phases, in this order (all by default)")
    p.add_argument("--stepped", help="only these stepped phases (all by default)")
    p.add_argument("--runners", action="store_true", help="report each worker's model runner class")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--dtype", default="auto")
    args = p.parse_args()

    from vllm import LLM

    llm = LLM(model=args.model, tensor_parallel_size=args.tp, enforce_eager=True, max_model_len=256,
              distributed_executor_backend="mp", seed=0, dtype=args.dtype)
    control = Control(args.shm_dir) if args.switch else None
    rounds, phases = [], []
    for mode in args.rounds.split(","):
        if control is not None:
            control.set(mode)
        tokens = {}
        all_phases = phase_params()
        for name in args.phases.split(",") if args.phases else all_phases:
            params = all_phases[name]
            first = control.call_index() if control else None
            tokens[name] = [summary(o) for o in llm.generate(PROMPTS, params, use_tqdm=False)]
            phases.append({"round": mode, "phase": name, "after": first,
                           "last": control.call_index() if control else None})
        stepped = stepped_params()
        for name in args.stepped.split(",") if args.stepped else stepped:
            params = stepped[name]
            first = control.call_index() if control else None
            tokens[name], flips = run_stepped(llm, control, f"{mode}-{name}", params)
            phases.append({"round": mode, "phase": name, "after": first,
                           "last": control.call_index() if control else None, "flips": flips})
        rounds.append(tokens)
    result: dict[str, object] = {"rounds": rounds, "phases": phases}
    if args.runners:
        result["runners"] = llm.collective_rpc(runner_class)
    if args.sidecar:
        result["sidecar"] = sidecar_answers(args.sidecar)
    if args.shm_dir:
        result["rings"] = read_rings(args.shm_dir)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
