"""`gatherwise generate`: run the TP engine on P local ranks and print the tokens (and modes) it produced.

torch is imported only after the arguments parse, so a bad argument fails fast with argparse's exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys


def _mode(text: str) -> str:
    from engine_hooks.modes import IMPLEMENTED_LABELS

    if text in IMPLEMENTED_LABELS:
        return text
    if text.startswith("schedule:") and text[len("schedule:"):].lstrip("-").isdigit():
        return text
    raise argparse.ArgumentTypeError(
        f"invalid mode {text!r}: expected {', '.join(IMPLEMENTED_LABELS)} or schedule:SEED (an integer)")


def _ranged(kind: type, low: float, high: float | None = None, low_open: bool = False):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a valid {kind.__name__}") from None
        if (value <= low if low_open else value < low) or (high is not None and value > high):
            bound = f"{'>' if low_open else '>='} {low}" + (f" and <= {high}" if high is not None else "")
            raise argparse.ArgumentTypeError(f"{value} out of range: must be {bound}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gatherwise generate",
                                description="Run the tensor-parallel engine on P local ranks and print its tokens.")
    p.add_argument("--tp", type=_ranged(int, 1, 64), default=1, help="tensor-parallel size P (local ranks)")
    p.add_argument("--mode", type=_mode, default="all_gather",
                   help="all_gather | gather | schedule:SEED (random table switches drawn from SEED)")
    p.add_argument("--prompts", type=_ranged(int, 1, 4096), default=8, help="number of requests")
    p.add_argument("--max-new-tokens", type=_ranged(int, 1, 4096), default=16,
                   help="token budget T; each request draws its own in [ceil(T/2), T] so requests leave at "
                        "different steps")
    p.add_argument("--temperature", type=_ranged(float, 0.0), default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=_ranged(int, 0), default=0, help="0 = off")
    p.add_argument("--top-p", type=_ranged(float, 0.0, 1.0, low_open=True), default=1.0, help="1 = off")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts and of sampling")
    p.add_argument("--vocab", type=_ranged(int, 1), default=None, help="vocab of the random model (default 32000)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="logits dtype")
    p.add_argument("--compute-dtype", choices=("float64", "float32"), default="float64",
                   help="model compute dtype (float64 keeps tokens identical across P; float32 is faster)")
    p.add_argument("--checkpoint", default=None, help="HF Llama/Qwen2 directory (config.json + *.safetensors)")
    p.add_argument("--weights-seed", type=int, default=0, help="seed of the random model's weights")
    p.add_argument("--max-batch", type=_ranged(int, 1, 1024), default=16, help="most requests running at once")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu (gloo) or cuda (NCCL)")
    p.add_argument("--threads", type=_ranged(int, 1, 256), default=1,
                   help="torch CPU threads per rank (1 keeps P ranks from oversubscribing the cores)")
    p.add_argument("--timeout", type=_ranged(float, 1.0), default=600.0, help="seconds before the run is abandoned")
    p.add_argument("--json", action="store_true", help="print one JSON object: tokens, modes, collectives")
    return p


def generate_main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.checkpoint is not None and args.vocab is not None:
        parser.error("--vocab applies to the random model only; a checkpoint brings its own vocab")

    import torch

    from engine_hooks.sampling import SamplingParams
    from tp_engine.config import load_hf_config
    from tp_engine.launch import LaunchError, launch
    from tp_engine.runner import GenerateSpec, ModelSpec, generate_rank

    model = ModelSpec(vocab=args.vocab or 32000, checkpoint=args.checkpoint, weights_seed=args.weights_seed,
                      compute_dtype=args.compute_dtype, device=args.device)
    spec = GenerateSpec(model=model, mode=args.mode, num_prompts=args.prompts, max_new_tokens=args.max_new_tokens,
                        seed=args.seed, params=SamplingParams(args.temperature, args.top_k, args.top_p, args.seed),
                        logits_dtype=args.dtype, max_batch=args.max_batch)
    try:
        config = model.config_and_source()[0] if args.checkpoint is None else load_hf_config(args.checkpoint)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        parser.error(f"--checkpoint {args.checkpoint}: {exc}")
    if args.tp > config.num_heads:
        parser.error(f"--tp {args.tp} exceeds the model's {config.num_heads} attention heads")
    if args.device == "cuda" and args.tp > torch.cuda.device_count():
        parser.error(f"--tp {args.tp} needs {args.tp} GPUs, {torch.cuda.device_count()} visible")
    try:
        if args.tp == 1 and args.device == "cpu":
            torch.set_num_threads(args.threads)
            results = [generate_rank(0, 1, spec)]  # P=1 runs in-process: same code path, no process group
        else:
            results = launch(generate_rank, args.tp, spec, device=args.device, timeout=args.timeout,
                             threads_per_rank=args.threads)
    except (LaunchError, ValueError, FileNotFoundError, KeyError) as exc:
        print(f"gatherwise generate: error: {exc}", file=sys.stderr)
        return 1
    tokens = [results[0].tokens[i] for i in sorted(results[0].tokens)]
    if args.json:
        print(json.dumps({"tokens": tokens, "modes": [r.modes for r in results],
                          "collectives": [r.collectives for r in results]}))
        return 0
    first = results[0]
    print(f"tp={args.tp} mode={args.mode} requests={len(tokens)} logits calls={len(first.modes)} "
          f"batch sizes {min(first.batch_sizes)}..{max(first.batch_sizes)}")
    for i, toks in enumerate(tokens):
        more = " ..." if len(toks) > 12 else ""
        print(f"  request {i:3d}: {len(toks):3d} tokens  {' '.join(map(str, toks[:12]))}{more}")
    for mode in sorted(set(first.modes)):
        print(f"  {mode}: {first.modes.count(mode)} calls")
    agree = all(r.modes == first.modes for r in results)
    print(f"  modes identical on all {len(results)} ranks: {agree}")
    return 0


def engine_main(argv: list[str] | None = None) -> int:
    from tp_engine.synthetic_load import engine_main as run_engine

    return run_engine(argv)
