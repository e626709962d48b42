"""One SGLang engine on a trained model (at its TP, with its tokenizer) in its own process: real prompts, the mode
switched through the engine's control block between phases and between the chunks of one streamed generation;
prints one JSON object on its last line.

`python -m tests.sglang.trained_run --model DIR --tp N --tokenizer [--shm-dir DIR]`

Phases (the table set before it with the plugin on; the engine starts in sharded, its initial table):
- greedy_sharded   sharded: a batch of the model's real prompts
- greedy_all       all_gather, the same batch
- greedy_gather    gather, the same batch
- sampled          gather: T 0.8 / top-p 0.95, one request at a time (SGLang's fixed random_seed keeps plain SGLang
                   reproducible there), then T 1.0 / top-p 0.95 in all_gather
- structured       sharded table: greedy constrained by a regex and by a JSON schema (grammars step aside)
- streamed         one streamed greedy generation, its table flipped gather -> sharded -> all_gather -> ... every
                   few chunks (mid-generation)
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from tests._engine_harness import Control
from tests._trained_models import prompt_ids
from tests.sglang.engine_run import FLIP_EVERY, Controller, PhaseMarks, run_phases

if TYPE_CHECKING:
    import sglang

REGEX = "[0-9]{4}"
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
          "additionalProperties": False}
MAX_NEW = 16
STREAM_FLIPS = ("gather", "sharded", "all_gather")


def greedy(**extra: Any) -> dict:
    return {"temperature": 0.0, "max_new_tokens": MAX_NEW, **extra}


def phases(engine: sglang.Engine, ctl: Controller, marks: PhaseMarks, args: argparse.Namespace) -> dict:
    control = Control(args.shm_dir)
    ids = prompt_ids(args.model)

    def batch(params: list[dict] | dict, batch_ids: list[list[int]] = ids) -> list[dict]:
        return [{"ids": o["output_ids"], "text": o["text"]}
                for o in engine.generate(input_ids=batch_ids, sampling_params=params)]

    result: dict = {}
    result["greedy_sharded"] = batch(greedy())
    marks.mark("greedy_sharded")
    for phase, mode in (("greedy_all", "all_gather"), ("greedy_gather", "gather")):
        control.set(mode)
        result[phase] = batch(greedy())
        marks.mark(phase)
    sampled = []
    for mode, temperature in (("gather", 0.8), ("all_gather", 1.0)):
        control.set(mode)
        for p in ids:
            out = engine.generate(input_ids=p, sampling_params={"temperature": temperature, "top_p": 0.95,
                                                                "max_new_tokens": MAX_NEW})
            sampled.append({"ids": out["output_ids"], "text": out["text"]})
    result["sampled"] = sampled
    marks.mark("sampled")
    control.set("sharded")
    result["structured"] = batch([greedy(regex=REGEX), greedy(json_schema=json.dumps(SCHEMA))], ids[:2])
    marks.mark("structured")
    flips, chunks = [], []
    for i, chunk in enumerate(engine.generate(input_ids=ids[0], sampling_params=greedy(max_new_tokens=40,
                                                                                        ignore_eos=True),
                                              stream=True)):
        chunks.append({"ids": chunk["output_ids"], "text": chunk["text"]})
        if i % FLIP_EVERY == FLIP_EVERY - 1:
            mode = STREAM_FLIPS[(i // FLIP_EVERY) % len(STREAM_FLIPS)]
            flips.append({"chunk": i, "mode": mode, "set": control.set(mode)})
    result["streamed"] = chunks
    result["flips"] = flips
    marks.mark("streamed")
    return result


def main() -> None:
    run_phases(phases)


if __name__ == "__main__":
    main()
