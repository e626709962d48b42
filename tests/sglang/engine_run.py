"""One SGLang engine (TP=2 on CPU, tiny Llama) in its own process; prints one JSON object on its last line.

`python -m tests.sglang.engine_run --model DIR [--shm-dir DIR --sidecar URL --token T]`
The plugin is switched by the environment this process gets (GATHERWISE_ENABLE, GATHERWISE_ENGINE_*).

Every run makes the same requests in the same order, so a plain-SGLang run and a gatherwise run are comparable
phase by phase. With --sidecar, the mode is set through the sidecar's HTTP API (PUT /v1/mode) between phases
and, in the streamed phases, between the chunks of one generation (mid-generation). The engine starts with a
fixed random_seed, and sampled phases send one request at a time, so that SGLang's own sampling (torch's
generator, drawn per batch) is reproducible from run to run: plain SGLang is deterministic there.

Phases (mode asked for before it, gatherwise run; the engine starts in sharded mode, its initial table):
- greedy_sharded      sharded: every rank takes the argmax from the shards' (max, index) pairs
- sampled_c           sharded table, sampled requests one at a time: they run all_gather
- streamed_sharded    one streamed greedy generation, switched to all_gather mid-generation
- greedy_a            all_gather: a batch of prompts of different lengths
- greedy_b            gather
- logprobs            gather: greedy with top-3 logprobs (ranks other than 0 write placeholder logprobs)
- sampled_a           gather: sampled requests one at a time (only rank 0 draws)
- sampled_b           all_gather: every rank draws again (they adopt rank 0's generator state first)
- greedy_mixed        all_gather, with buckets 1 and 2 pinned to gather: modes change as the batch shrinks
- streamed_greedy     flipped gather <-> all_gather every few chunks of one streamed generation
- streamed_sampled    the same, sampled: draws resume on every rank after each gather stretch
Then the sidecar's /metrics and /v1/mode, and every rank's ring (call_index -> mode), while the engine runs.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tests._engine_harness import engine_run_arguments, http, read_rings

if TYPE_CHECKING:
    import sglang

    from gatherwise.sidecar.ingest.ring_reader import RingReader

PROMPTS = [[1, 15, 27, 99, 4000, 12], [7, 8], [31000, 5, 5, 5, 17, 23, 29, 31, 37], [2], [900, 901, 902, 903],
           [12345, 54321, 11]]
MAX_TOKENS = [24, 16, 20, 12, 24, 8]
SAMPLED_PROMPTS = [[3, 14, 15, 92, 65], [27, 18, 28], [1, 41, 42, 13, 56, 2]]
STREAM_PROMPT = [101, 202, 303, 404]
STREAM_TOKENS = 40
FLIP_EVERY = 4  # chunks between two mode flips in the streamed phases
RANDOM_SEED = 1234
ENGINE_ARGS = dict(device="cpu", tp_size=2, attention_backend="torch_native", skip_tokenizer_init=True,
                   disable_cuda_graph=True, dtype="float32", mem_fraction_static=0.05, max_total_tokens=2048,
                   random_seed=RANDOM_SEED, log_level="info")


def greedy(n: int) -> dict:
    return {"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True}


def sampled(n: int) -> dict:
    return {"temperature": 0.8, "top_p": 0.9, "max_new_tokens": n, "ignore_eos": True}


class Controller:
    """Sets the mode through the sidecar; does nothing for a plain-SGLang run (no sidecar)."""

    def __init__(self, url: str | None, token: str | None) -> None:
        self.url, self.token = url, token
        self.puts: list[dict[str, object]] = []

    def put(self, body: dict, phase: str) -> None:
        if self.url is None:
            return
        # wait=0: the engine applies a command at its next logits call, and an idle engine makes none
        code, text = http("PUT", f"{self.url}/v1/mode?wait=0", body, self.token)
        try:
            reply = json.loads(text)
        except ValueError:
            reply = text  # the test reports the status and text
        self.puts.append({"phase": phase, "body": body, "status": code, "reply": reply})

    def wait_attached(self, timeout_s: float = 120.0) -> None:
        """The sidecar attaches to the engine once its hooks exist (after the first logits call)."""
        deadline = time.monotonic() + timeout_s
        while self.url is not None and time.monotonic() < deadline:
            try:
                if http("GET", f"{self.url}/v1/mode")[0] == 200:
                    return
            except OSError:  # not accepting connections yet
                pass
            time.sleep(0.1)


class PhaseMarks:
    """The last call index rank 0 recorded by the end of each phase (from its ring), to split the rings by phase.
    Rank 0 writes a call's record before SGLang processes the call's ids, so a finished phase is recorded."""

    def __init__(self, shm_dir: str | None) -> None:
        self.shm_dir, self.last = shm_dir, -1
        self.reader: RingReader | None = None
        self.marks: dict[str, int] = {}

    def mark(self, phase: str) -> None:
        if self.shm_dir is None:
            return
        if self.reader is None:
            from gatherwise.sidecar.ingest.ring_reader import RingReader, discover_engines

            engines = discover_engines(self.shm_dir)
            if not engines:
                return
            self.reader = RingReader(engines[0].rings[0])
        records, _ = self.reader.read_new()
        self.last = max([self.last] + [r.call_index for r in records])
        self.marks[phase] = self.last


def batch_ids(engine: sglang.Engine, prompts: list[list[int]], params: list[dict], **kwargs: Any) -> list[list[int]]:
    return [out["output_ids"] for out in engine.generate(input_ids=prompts, sampling_params=params, **kwargs)]


def one_at_a_time(engine: sglang.Engine, prompts: list[list[int]], n: int) -> list[list[int]]:
    return [engine.generate(input_ids=p, sampling_params=sampled(n))["output_ids"] for p in prompts]


def streamed(engine: sglang.Engine, params: dict, ctl: Controller, phase: str,
             flips: tuple[str, ...] = ("gather", "all_gather"),
             stop_after: int | None = None) -> list[int]:
    """One streamed generation; the mode flips between chunks (mid-generation), cycling through `flips`
    (`stop_after` flips at most)."""
    ids: list[int] = []
    made = 0
    for i, chunk in enumerate(engine.generate(input_ids=STREAM_PROMPT, sampling_params=params, stream=True)):
        ids = list(chunk["output_ids"])  # cumulative output ids
        if i % FLIP_EVERY == FLIP_EVERY - 1 and (stop_after is None or made < stop_after):
            ctl.put({"mode": flips[(i // FLIP_EVERY) % len(flips)]}, phase)
            made += 1
    return ids


def run_phases(phases: Callable[[Any, Controller, PhaseMarks, argparse.Namespace], dict]) -> None:
    """The frame of an engine run: SGLang started with ENGINE_ARGS, `phases` run on it, their marks and the
    rings added, the result printed for the test, the process ended."""
    parser = engine_run_arguments()
    parser.add_argument("--tp", type=int, default=ENGINE_ARGS["tp_size"])
    parser.add_argument("--tokenizer", action="store_true", help="start SGLang's tokenizer (grammars need it)")
    parser.add_argument("--mem-fraction-static", type=float, default=ENGINE_ARGS["mem_fraction_static"])
    parser.add_argument("--real-prompts", action="store_true",
                        help="the model's real prompts (a trained model's) where the phases take prompts")
    args = parser.parse_args()

    import sglang

    ctl = Controller(args.sidecar, args.token)
    marks = PhaseMarks(args.shm_dir)
    engine = sglang.Engine(model_path=args.model, **{**ENGINE_ARGS, "tp_size": args.tp,
                                                     "skip_tokenizer_init": not args.tokenizer,
                                                     "mem_fraction_static": args.mem_fraction_static})
    try:
        result = phases(engine, ctl, marks, args)
        result["marks"] = marks.marks
        if args.shm_dir:
            result["rings"] = read_rings(args.shm_dir)
    finally:
        engine.shutdown()
    print("RESULT " + json.dumps(result), flush=True)
    os._exit(0)  # SGLang's shutdown leaves non-daemon threads behind; the result is out


def phases(engine: sglang.Engine, ctl: Controller, marks: PhaseMarks, args: argparse.Namespace) -> dict:
    result: dict = {}
    result["greedy_sharded"] = batch_ids(engine, PROMPTS, [greedy(n) for n in MAX_TOKENS])
    marks.mark("greedy_sharded")
    result["sampled_c"] = one_at_a_time(engine, SAMPLED_PROMPTS, 12)
    marks.mark("sampled_c")
    ctl.wait_attached()
    result["streamed_sharded"] = streamed(engine, greedy(STREAM_TOKENS), ctl, "streamed_sharded",
                                          flips=("all_gather",), stop_after=1)
    marks.mark("streamed_sharded")
    result["greedy_a"] = batch_ids(engine, PROMPTS, [greedy(n) for n in MAX_TOKENS])
    marks.mark("greedy_a")
    ctl.put({"mode": "gather"}, "greedy_b")
    result["greedy_b"] = batch_ids(engine, PROMPTS, [greedy(n) for n in MAX_TOKENS])
    marks.mark("greedy_b")
    outs = engine.generate(input_ids=PROMPTS[:3], sampling_params=[greedy(n) for n in MAX_TOKENS[:3]],
                           return_logprob=True, top_logprobs_num=3)
    result["logprobs"] = [{"ids": o["output_ids"], "token_logprobs": o["meta_info"]["output_token_logprobs"],
                           "top": o["meta_info"]["output_top_logprobs"]} for o in outs]
    marks.mark("logprobs")
    result["sampled_a"] = one_at_a_time(engine, SAMPLED_PROMPTS, 12)
    marks.mark("sampled_a")
    ctl.put({"mode": "all_gather"}, "sampled_b")
    result["sampled_b"] = one_at_a_time(engine, SAMPLED_PROMPTS, 12)
    marks.mark("sampled_b")
    ctl.put({"mode": "gather", "buckets": [1, 2]}, "greedy_mixed")
    result["greedy_mixed"] = batch_ids(engine, PROMPTS, [greedy(n) for n in MAX_TOKENS])
    marks.mark("greedy_mixed")
    ctl.put({"mode": "all_gather"}, "streamed_greedy")
    result["streamed_greedy"] = streamed(engine, greedy(STREAM_TOKENS), ctl, "streamed_greedy")
    marks.mark("streamed_greedy")
    ctl.put({"mode": "all_gather"}, "streamed_sampled")
    result["streamed_sampled"] = streamed(engine, sampled(STREAM_TOKENS), ctl, "streamed_sampled")
    marks.mark("streamed_sampled")
    if args.sidecar:
        time.sleep(1.5)  # let the sidecar ingest the last records before reading its metrics
        result["metrics"] = http("GET", f"{args.sidecar}/metrics")[1]
        code, mode = http("GET", f"{args.sidecar}/v1/mode")
        result["mode"] = json.loads(mode) if code == 200 else None
        result["puts"] = ctl.puts
    return result


def main() -> None:
    run_phases(phases)


if __name__ == "__main__":
    main()
