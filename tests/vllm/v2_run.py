"""vLLM's Model Runner V2 at TP=2 on this CPU, its kernels run by Triton's interpreter; prints one JSON object.

`python -m tests.vllm.v2_run --model DIR [--sidecar URL]` with VLLM_USE_V2_MODEL_RUNNER=1, TRITON_INTERPRET=1 and
tests/vllm/v2_on_cpu plus a PyPI triton on PYTHONPATH (tests/vllm/test_vllm_model_runner_v2.py sets them). Greedy
and seeded temperature-only requests (V2's keyed Gumbel noise; top-p needs vLLM's Triton top-k/top-p kernel, which
the interpreter cannot run as shipped). With --sidecar, what the sidecar then shows.
"""

from __future__ import annotations

import json

from tests._engine_harness import engine_run_arguments
from tests.vllm.engine_run import PROMPTS, token_ids
from tests.vllm.hooks_off_run import sidecar_view

TOKENS = 6  # V2 interpreted samples a request in ~0.1-0.5 s per step on this CPU: short requests
REQUESTS = 3


def runner_class(worker) -> str:
    """In each worker (LLM.collective_rpc; VLLM_ALLOW_INSECURE_SERIALIZATION=1 lets a function travel there)."""
    cls = type(worker.model_runner)
    return f"{cls.__module__}.{cls.__qualname__} < {cls.__mro__[1].__module__}.{cls.__mro__[1].__qualname__}"


def main() -> None:
    args = engine_run_arguments().parse_args()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=args.model, tensor_parallel_size=2, enforce_eager=True, max_model_len=256,
              distributed_executor_backend="mp", skip_tokenizer_init=True, seed=0)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in PROMPTS[:REQUESTS]]
    greedy = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True, detokenize=False)
    seeded = [SamplingParams(temperature=0.8, seed=100 + i, max_tokens=TOKENS, ignore_eos=True, detokenize=False)
              for i in range(REQUESTS)]
    result: dict[str, object] = {"greedy": token_ids(llm.generate(prompts, greedy, use_tqdm=False)),
                                 "seeded": token_ids(llm.generate(prompts, seeded, use_tqdm=False)),
                                 "runners": llm.collective_rpc(runner_class)}
    if args.sidecar:
        result["sidecar"] = sidecar_view(args.sidecar, reasons=2)  # one notice per worker (TP rank)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
