"""One SGLang engine (TP=2 on CPU, tiny Llama; or a trained model at its TP) with `engine.sampler: gatherwise`,
next to a sidecar; prints one JSON object on its last line (the phases below, the rings, the log).

`python -m tests.sglang.engine_run_sampler --model DIR --shm-dir DIR --sidecar URL --token T [--tp N --real-prompts]`
With --real-prompts the requests keep their ids and sampling parameters and take the model's real prompts (chat
questions through its template, or plain text).
The environment switches the plugin on and picks the sampler (GATHERWISE_ENGINE_SAMPLER=gatherwise); the engine
starts in sharded mode. Every request carries a fixed request id, so gatherwise's sampler keys it the same way
wherever it runs: a request must draw the same tokens alone or batched, in every mode, and across switches.

Phases (mode asked for before it):
- alone_sharded       sharded: the sampled requests (top-p, top-k, min-p) and a greedy one, one at a time
- batch_sharded       sharded: the same requests in one batch, with two other sampled requests
- stepped_aside       sharded: a sampled request with a frequency penalty, and one with logprobs (SGLang's sampler)
- seeded_sharded      sharded: a request with its own sampling_seed, alone
- batch_all_gather    all_gather: the batch of batch_sharded
- seeded_batch        all_gather: the seeded request again, another request id, in a batch with others
- batch_gather        gather: the batch of batch_sharded
- streamed_switch     the top-p request streamed, the mode cycling sharded -> all_gather -> gather between chunks
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from tests.sglang.engine_run import Controller, PhaseMarks, run_phases

if TYPE_CHECKING:
    import sglang

TOKENS = 16
FLIP_EVERY = 3  # chunks between two mode switches in streamed_switch
SEED = 4242
# (request id, prompt, sampling parameters): what the phases compare
REQUESTS = [("top-p", [3, 14, 15, 92, 65], {"temperature": 0.8, "top_p": 0.95}),
            ("top-k", [27, 18, 28], {"temperature": 0.8, "top_k": 20}),
            ("min-p", [1, 41, 42, 13, 56, 2], {"temperature": 0.9, "min_p": 0.1}),
            ("greedy", [7, 8, 9], {"temperature": 0.0})]
OTHERS = [("other-1", [500, 501], {"temperature": 1.0, "top_p": 0.9}),
          ("other-2", [9000, 12, 13, 14, 15, 16, 17], {"temperature": 0.7, "top_k": 50})]
SEEDED = ([11, 22, 33], {"temperature": 0.8, "top_p": 0.95, "sampling_seed": SEED})
PENALTY = ("penalty", [4, 5, 6], {"temperature": 0.8, "top_p": 0.95, "frequency_penalty": 0.5})
LOGPROBS = ("logprobs", [6, 5, 4], {"temperature": 0.8, "top_p": 0.95})
Request = tuple[str, list[int], dict]


def with_real_prompts(model: str) -> tuple[list[Request], list[Request], tuple[list[int], dict], Request, Request]:
    """REQUESTS, OTHERS, SEEDED, PENALTY and LOGPROBS with the model's real prompts in place of the ids."""
    from tests._trained_models import prompt_ids

    texts = iter(prompt_ids(model, len(REQUESTS) + len(OTHERS) + 3))
    requests = [(rid, next(texts), extra) for rid, _, extra in REQUESTS]
    others = [(rid, next(texts), extra) for rid, _, extra in OTHERS]
    seeded = (next(texts), SEEDED[1])
    return requests, others, seeded, (PENALTY[0], next(texts), PENALTY[2]), (LOGPROBS[0], next(texts), LOGPROBS[2])


def params(extra: dict) -> dict:
    return dict(extra, max_new_tokens=TOKENS, ignore_eos=True)


def one(engine: sglang.Engine, rid: str, prompt: list[int], extra: dict, **kwargs: Any) -> list[int]:
    return engine.generate(input_ids=prompt, sampling_params=params(extra), rid=rid, **kwargs)["output_ids"]


def batch(engine: sglang.Engine, requests: list[tuple[str, list[int], dict]]) -> dict[str, list[int]]:
    outs = engine.generate(input_ids=[p for _, p, _ in requests], sampling_params=[params(e) for *_, e in requests],
                           rid=[rid for rid, _, _ in requests])
    return {rid: out["output_ids"] for (rid, _, _), out in zip(requests, outs, strict=True)}


def streamed(engine: sglang.Engine, ctl: Controller, request: Request) -> tuple[list[int], int]:
    """The (top-p) request streamed; the mode cycles between chunks. Returns its ids and the switches made."""
    rid, prompt, extra = request
    ids: list[int] = []
    cycle = ("all_gather", "gather", "sharded")
    made = 0
    for i, chunk in enumerate(engine.generate(input_ids=prompt, sampling_params=params(extra), rid=rid,
                                              stream=True)):
        ids = list(chunk["output_ids"])  # cumulative output ids
        if i % FLIP_EVERY == FLIP_EVERY - 1:
            ctl.put({"mode": cycle[made % len(cycle)]}, "streamed_switch")
            made += 1
    return ids, made


def phases(engine: sglang.Engine, ctl: Controller, marks: PhaseMarks, args: argparse.Namespace) -> dict:
    requests, others, seeded, penalty, logprobs = (with_real_prompts(args.model) if args.real_prompts
                                                   else (REQUESTS, OTHERS, SEEDED, PENALTY, LOGPROBS))
    result: dict = {}
    result["alone_sharded"] = {rid: one(engine, rid, prompt, extra) for rid, prompt, extra in requests}
    marks.mark("alone_sharded")
    ctl.wait_attached()
    result["batch_sharded"] = batch(engine, requests + others)
    marks.mark("batch_sharded")
    rid, prompt, extra = logprobs
    out = engine.generate(input_ids=prompt, sampling_params=params(extra), rid=rid, return_logprob=True)
    result["stepped_aside"] = {penalty[0]: one(engine, *penalty), rid: out["output_ids"],
                               "logprob_count": len(out["meta_info"]["output_token_logprobs"])}
    marks.mark("stepped_aside")
    result["seeded_sharded"] = one(engine, "seeded-a", *seeded)
    marks.mark("seeded_sharded")
    ctl.put({"mode": "all_gather"}, "batch_all_gather")
    result["batch_all_gather"] = batch(engine, requests + others)
    marks.mark("batch_all_gather")
    result["seeded_batch"] = batch(engine, [others[1], ("seeded-b", *seeded), others[0]])["seeded-b"]
    marks.mark("seeded_batch")
    ctl.put({"mode": "gather"}, "batch_gather")
    result["batch_gather"] = batch(engine, requests + others)
    marks.mark("batch_gather")
    ctl.put({"mode": "sharded"}, "streamed_switch")
    result["streamed_switch"], result["switches"] = streamed(engine, ctl, requests[0])
    marks.mark("streamed_switch")
    result["puts"] = ctl.puts
    return result


def main() -> None:
    run_phases(phases)


if __name__ == "__main__":
    main()
