"""Where the logits of a trained model really are: nucleus sizes, shard fit, and the logits path's share of a step.

    python -m gatherwise.bench.real_rows --model smollm2|gemma3 [--rows 384] [--out DIR]

1. Rows: the model (transformers, float32, from `gatherwise models fetch`) answers the engine's demo questions
   (tp_engine/chat_load.py; through the chat template where the model has one), sampling at T 0.8 / top-p 0.95
   and at T 1.0 / top-p 0.95; every next-token logits row of those answers is kept (`--rows` per temperature).
2. Per row and temperature: the top-p 0.95 nucleus size, and whether the kept set fits the sharded sampler's
   per-shard candidates at the model's engine TP (no shard holds more than `top_p_candidates(width)` kept tokens;
   where one does, the row takes the fallback).
3. The logits path's share of a decode step on the reference engine at the model's engine TP, per mode: B sampled
   requests (T 0.8 / top-p 0.95) answered to completion; forward and logits call timed per step on rank 0.
Writes real_rows.json (and rows-T<temperature>.pt, the rows themselves, for `gatherwise bench sampler`'s real
rows) and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

TEMPERATURES = (0.8, 1.0)
TOP_P = 0.95


def collect_rows(directory: Path, temperature: float, rows: int, seed: int = 0) -> torch.Tensor:
    """Next-token logits rows [rows, V] (float32) of the model's own sampled answers to the demo questions."""
    from transformers import AutoModelForCausalLM

    from gatherwise.tp_engine.chat_load import QUESTIONS
    from gatherwise.tp_engine.tokenizer import CheckpointTokenizer

    tok = CheckpointTokenizer(directory)
    encode = tok.encode_chat if tok.has_chat_template() else tok.encode
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    torch.manual_seed(seed)
    kept: list[torch.Tensor] = []
    total = 0
    with torch.no_grad():
        for i in range(10 * len(QUESTIONS)):
            if total >= rows:
                break
            ids = torch.tensor([encode(QUESTIONS[i % len(QUESTIONS)])])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=temperature,
                                 top_p=TOP_P, top_k=0, max_new_tokens=64, output_logits=True,
                                 return_dict_in_generate=True, pad_token_id=0)
            step_rows = torch.cat(out.logits)  # [steps, V]
            kept.append(step_rows)
            total += step_rows.shape[0]
    return torch.cat(kept)[:rows].float()


def kept_sizes(rows: torch.Tensor, temperature: float, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: how many tokens top-p keeps, and the sorted order (value desc, index asc) of the columns."""
    probs = torch.softmax(rows.to(torch.float64) / temperature, dim=-1)
    order = rows.argsort(dim=-1, descending=True, stable=True)
    cum = probs.gather(1, order).cumsum(dim=-1)
    before = torch.cat((torch.zeros_like(cum[:, :1]), cum[:, :-1]), dim=-1)
    return (before < top_p).sum(dim=-1), order


def shard_overflow(order: torch.Tensor, kept: torch.Tensor, width: int, candidates: int) -> torch.Tensor:
    """Per row: whether some shard (contiguous `width` columns) holds more than `candidates` kept tokens."""
    over = torch.zeros(order.shape[0], dtype=torch.bool)
    for r in range(order.shape[0]):
        shards = torch.bincount(order[r, : int(kept[r])] // width)
        over[r] = bool((shards > candidates).any())
    return over


def percentiles(values: list[int]) -> dict[str, float]:
    ordered = sorted(values)

    def at(q: float) -> float:
        return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])

    return {"median": statistics.median(ordered), "p90": at(0.90), "p99": at(0.99), "max": float(ordered[-1])}


def step_shares(directory: Path, tp: int, batch: int, max_new: int) -> dict[str, Any]:
    """The logits path's share of each decode step on the reference engine, per mode (rank 0's clock)."""
    from gatherwise.modes import IMPLEMENTED_LABELS
    from gatherwise.tp_engine.launch import launch

    per_rank = launch(_time_steps, tp, str(directory), batch, max_new, list(IMPLEMENTED_LABELS), timeout=1800)
    return per_rank[0]


def _time_steps(rank: int, world: int, directory: str, batch: int, max_new: int, modes: list[str]) -> dict:
    from gatherwise.engine_hooks.comm import default_communicator
    from gatherwise.engine_hooks.sampling_params import SamplingParams
    from gatherwise.tp_engine.chat_load import QUESTIONS
    from gatherwise.tp_engine.layers import TPGroup
    from gatherwise.tp_engine.runner import ModelSpec, make_path
    from gatherwise.tp_engine.scheduler import Request, Scheduler, max_sequence_length
    from gatherwise.tp_engine.tokenizer import CheckpointTokenizer

    torch.set_num_threads(1)
    tp = TPGroup.from_dist()
    model = ModelSpec(checkpoint=directory, compute_dtype="float32").load(tp)
    tok = CheckpointTokenizer(directory)
    encode = tok.encode_chat if tok.has_chat_template() else tok.encode
    params = SamplingParams(temperature=0.8, top_p=TOP_P, seed=1)
    out: dict[str, Any] = {}
    comm = default_communicator()
    for mode in modes:
        path = make_path(comm, model.config.vocab_size, mode, torch.float32, model.device, keep_log=False)
        requests = [Request(i, tuple(encode(QUESTIONS[i % len(QUESTIONS)])), max_new, params=params)
                    for i in range(batch)]
        cache = model.new_cache(batch, max_sequence_length(requests))
        scheduler = Scheduler(requests, cache, batch)
        forward_s, path_s, steps = 0.0, 0.0, 0
        dev = model.device
        while (step := scheduler.next_batch()) is not None:
            t0 = time.perf_counter()
            buf = path.logits_buffer(len(step.rows))
            model.forward(torch.tensor(step.tokens, device=dev), torch.tensor(step.positions, device=dev),
                          torch.tensor(step.slots, device=dev), cache, torch.tensor(step.logit_rows, device=dev), buf)
            t1 = time.perf_counter()
            tokens = path.run(step.rows)
            t2 = time.perf_counter()
            if steps > 0:  # the prefill step is not a decode step
                forward_s, path_s = forward_s + t1 - t0, path_s + t2 - t1
            steps += 1
            scheduler.complete(tokens.tolist())
        decode = max(steps - 1, 1)
        out[mode] = {"decode_steps": steps - 1, "forward_ms": 1e3 * forward_s / decode,
                     "logits_path_ms": 1e3 * path_s / decode, "share": path_s / max(forward_s + path_s, 1e-12)}
    return out


def main(argv: list[str] | None = None) -> int:
    from gatherwise.engine_hooks.logits_path import shard_width
    from gatherwise.engine_hooks.shard_sampling import top_p_candidates
    from gatherwise.tp_engine.trained_models import MODELS, fetch

    p = argparse.ArgumentParser(prog="python -m gatherwise.bench.real_rows", description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    p.add_argument("--rows", type=int, default=384, help="logits rows per temperature")
    p.add_argument("--batch", type=int, default=8, help="requests of the step-share run")
    p.add_argument("--max-new-tokens", type=int, default=24, help="tokens of each request in the step-share run")
    p.add_argument("--out", type=Path, default=Path("out/real_rows"))
    args = p.parse_args(argv)
    directory, model = fetch(args.model), MODELS[args.model]
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"model": args.model, "tp": model.engine_tp, "top_p": TOP_P, "temperatures": {}}
    for temperature in TEMPERATURES:
        rows = collect_rows(directory, temperature, args.rows)
        torch.save(rows, args.out / f"rows-{args.model}-T{temperature}.pt")
        sizes, order = kept_sizes(rows, temperature, TOP_P)
        width = shard_width(rows.shape[1], model.engine_tp)
        candidates = report["candidates_per_shard"] = top_p_candidates(width)
        over = shard_overflow(order, sizes, width, candidates)
        values = sizes.tolist()
        report["temperatures"][str(temperature)] = {
            "rows": len(values), "nucleus": percentiles(values),
            "share_over_64": sum(v > 64 for v in values) / len(values),
            "share_over_128": sum(v > 128 for v in values) / len(values),
            "fallback_share": float(over.float().mean()),
        }
    report["step_share"] = step_shares(directory, model.engine_tp, args.batch, args.max_new_tokens)
    (args.out / f"real_rows-{args.model}.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
