"""One vLLM engine (TP=2 on CPU, tiny Llama, or a trained model at its TP; token-id prompts) with
`engine.sampler: gatherwise`, in its own process; prints one JSON object on its last line.

`python -m tests.vllm.gatherwise_sampler_run --model DIR --shm-dir DIR [--rounds all_gather,gather,...]`

The engine core runs in this process and is stepped one model step at a time (what a streaming server does),
with request ids of our own (vLLM's random suffix off): the same request has the same id in every round, so
gatherwise's sampler keys it alike in every round. Each round sets the table through the engine's real
control block (gatherwise.sidecar.control.block_client), then runs:
- batch: REQUESTS together (top-p, top-k, min-p, seeded, greedy rows in one batch);
- alone (rounds named in ALONE_ROUNDS): each of REQUESTS on its own, under the same id;
- aside: a batch that gatherwise's sampler does not take (a penalty row, a logprobs row among sampled ones),
  which keeps vLLM's sampler.
The round "switched" starts in all_gather and flips the table between steps across all three modes (FLIPS).
Phase boundaries are rank 0's call index (the control block's heartbeat).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from tests._engine_harness import Control, engine_run_arguments, read_rings

if TYPE_CHECKING:
    from vllm import LLM

ROUNDS = ("all_gather", "gather", "sharded", "switched")
ALONE_ROUNDS = ("sharded",)
FLIPS = {1: "gather", 3: "sharded", 5: "all_gather", 7: "sharded", 9: "gather", 11: "sharded"}  # step -> mode
PROMPTS = [[1, 15, 27, 99, 4000, 12], [7, 8], [31000, 5, 5, 5, 17, 23, 29, 31, 37], [2, 600], [900, 901, 902, 903]]
MAX_TOKENS = 14
SAMPLED = dict(temperature=0.8, max_tokens=MAX_TOKENS, ignore_eos=True, detokenize=False)
REQUESTS = {"top_p": dict(SAMPLED, top_p=0.95), "top_k": dict(SAMPLED, top_k=20), "min_p": dict(SAMPLED, min_p=0.05),
            "seeded": dict(SAMPLED, top_p=0.95, seed=1234),
            "greedy": dict(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, detokenize=False)}
# the penalty row ends first, so the last steps step aside for the logprobs row alone
ASIDE = {"penalty": dict(SAMPLED, top_p=0.95, repetition_penalty=1.3, max_tokens=6),
         "logprobs": dict(SAMPLED, logprobs=2), "top_p": dict(SAMPLED, top_p=0.95)}


def prompt_of(name: str) -> list[int]:
    """Each request's own prompt, whichever batch it runs in (the warm-up request: the first)."""
    names = [*REQUESTS, *(f"aside-{name}" for name in ASIDE)]
    return PROMPTS[names.index(name) % len(PROMPTS)] if name in names else PROMPTS[0]


def run_stepped(llm: LLM, control: Control, requests: dict[str, dict], flips: dict[int, str] | None = None
                ) -> tuple[dict[str, list[int]], list[dict]]:
    """`requests` ({request id: SamplingParams arguments}) added at once, each with its own prompt, and stepped
    to the end."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine = llm.llm_engine
    for req_id, params in requests.items():
        engine.add_request(req_id, TokensPrompt(prompt_token_ids=prompt_of(req_id)), SamplingParams(**params))
    outputs: dict[str, list[int]] = {}
    applied, step = [], 0
    while engine.has_unfinished_requests():
        if flips and step in flips and control.set(flips[step]):
            applied.append({"step": step, "mode": flips[step], "call_index": control.call_index()})
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = list(out.outputs[0].token_ids)
        step += 1
    return outputs, applied


def main() -> None:
    p = engine_run_arguments()
    p.add_argument("--rounds", default=",".join(ROUNDS))
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--dtype", default="auto")
    args = p.parse_args()

    from vllm import LLM

    llm = LLM(model=args.model, tensor_parallel_size=args.tp, enforce_eager=True, max_model_len=256,
              distributed_executor_backend="mp", skip_tokenizer_init=True, seed=0, dtype=args.dtype)
    control = Control(args.shm_dir)
    rounds: dict[str, dict[str, object]] = {}
    phases = []

    def phase(round_name: str, name: str, requests: dict[str, dict], flips: dict[int, str] | None = None) -> dict:
        first = control.call_index()
        tokens, applied = run_stepped(llm, control, requests, flips)
        phases.append({"round": round_name, "phase": name, "after": first, "last": control.call_index(),
                       "flips": applied})
        return tokens

    phase("warm-up", "warm-up", {"warm-up": REQUESTS["greedy"]})  # the hooks install at the first hooked call
    for round_name in args.rounds.split(","):
        control.set("all_gather" if round_name == "switched" else round_name)
        result: dict[str, object] = {"batch": phase(round_name, "batch", REQUESTS,
                                                    FLIPS if round_name == "switched" else None)}
        if round_name in ALONE_ROUNDS:
            result["alone"] = {name: phase(round_name, f"alone-{name}", {name: params})[name]
                               for name, params in REQUESTS.items()}
        result["aside"] = phase(round_name, "aside", {f"aside-{name}": params for name, params in ASIDE.items()})
        rounds[round_name] = result
    print("RESULT " + json.dumps({"rounds": rounds, "phases": phases, "rings": read_rings(args.shm_dir)}),
          flush=True)


if __name__ == "__main__":
    main()
