"""`gatherwise generate`: run the TP engine on P ranks and print the tokens (and modes) it produced.

The ranks are local, or spread over nodes (`--nnodes/--node-rank/--dist-init-addr`, one command per node with the
same arguments): node 0 holds rank 0 and prints the output; every other node says which ranks it ran.

Prompts are text (`--prompt`, encoded with the checkpoint's own tokenizer, optionally through its chat
template) or token ids (`--prompt-ids`), in command-line order; without either, `--prompts N` random prompts.
With a checkpoint, generation stops at its end-of-sequence ids unless `--ignore-eos`.
torch is imported only after the arguments parse, so a bad argument fails fast with argparse's exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from gatherwise.logits_dtypes import LOGITS_DTYPES
from gatherwise.tp_engine.launch import MAX_LOCAL_RANKS
from gatherwise.tp_engine.nodes import add_node_args, nodes_from_args

SHOWN_TOKENS = 12  # of each request, in the plain-text output
# Upper bounds of the other arguments: beyond them a run is a mistake on a CPU (or a local node), not a workload.
MAX_REQUESTS = 4096
MAX_NEW_TOKENS = 4096
MAX_BATCH = 1024
MAX_THREADS = 256


def _mode(text: str) -> str:
    from gatherwise.modes import IMPLEMENTED_LABELS

    if text in IMPLEMENTED_LABELS:
        return text
    if text.startswith("schedule:") and text[len("schedule:"):].lstrip("-").isdigit():
        return text
    raise argparse.ArgumentTypeError(
        f"invalid mode {text!r}: expected {', '.join(IMPLEMENTED_LABELS)} or schedule:SEED (an integer)")


def _ranged(kind: type, low: float, high: float | None = None,
            low_open: bool = False) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a valid {kind.__name__}") from None
        if (value <= low if low_open else value < low) or (high is not None and value > high):
            bound = f"{'>' if low_open else '>='} {low}" + (f" and <= {high}" if high is not None else "")
            raise argparse.ArgumentTypeError(f"{value} out of range: must be {bound}")
        return value
    return parse


def _text_prompt(text: str) -> tuple[str, str]:
    if not text:
        raise argparse.ArgumentTypeError("empty prompt")
    return ("text", text)


def _ids_prompt(text: str) -> tuple[str, tuple[int, ...]]:
    try:
        ids = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of token ids") from None
    if any(i < 0 for i in ids):
        raise argparse.ArgumentTypeError(f"{text!r}: token ids must be >= 0")
    return ("ids", ids)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gatherwise generate",
                                description="Run the tensor-parallel engine on P ranks and print its tokens.")
    p.add_argument("--tp", type=_ranged(int, 1, MAX_LOCAL_RANKS), default=1,
                   help="tensor-parallel size P (ranks of the whole group, over all nodes)")
    p.add_argument("--mode", type=_mode, default="all_gather",
                   help="all_gather | gather | sharded | schedule:SEED (random table switches drawn from SEED)")
    p.add_argument("--prompts", type=_ranged(int, 1, MAX_REQUESTS), default=None,
                   help="number of random-prompt requests (default 8; not with --prompt/--prompt-ids)")
    p.add_argument("--prompt", dest="prompt_items", action="append", type=_text_prompt, default=[], metavar="TEXT",
                   help="a text prompt, encoded with the checkpoint's tokenizer.json (repeatable)")
    p.add_argument("--prompt-ids", dest="prompt_items", action="append", type=_ids_prompt, metavar="ID,ID,...",
                   help="a prompt of token ids, e.g. 1,2,3 (repeatable)")
    p.add_argument("--chat", action="store_true",
                   help="wrap each --prompt as one user message in the checkpoint's chat template")
    p.add_argument("--ignore-eos", action="store_true",
                   help="generate the full token budget even past the checkpoint's end-of-sequence ids")
    p.add_argument("--max-new-tokens", type=_ranged(int, 1, MAX_NEW_TOKENS), default=16,
                   help="token budget T; given prompts get T each, random ones draw their own in [ceil(T/2), T] so "
                        "requests leave at different steps")
    p.add_argument("--temperature", type=_ranged(float, 0.0), default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=_ranged(int, 0), default=0, help="0 = off")
    p.add_argument("--top-p", type=_ranged(float, 0.0, 1.0, low_open=True), default=1.0, help="1 = off")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts and of sampling")
    p.add_argument("--vocab", type=_ranged(int, 1), default=None, help="vocab of the random model (default 32000)")
    p.add_argument("--dtype", choices=LOGITS_DTYPES, default="float32", help="logits dtype")
    p.add_argument("--compute-dtype", choices=("float64", "float32"), default="float64",
                   help="model compute dtype (float64 keeps tokens identical across P; float32 is faster)")
    p.add_argument("--checkpoint", default=None,
                   help="HF Llama/Qwen2/Gemma3 directory (config.json + *.safetensors), e.g. what `gatherwise models "
                        "fetch` prints")
    p.add_argument("--weights-seed", type=int, default=0, help="seed of the random model's weights")
    p.add_argument("--max-batch", type=_ranged(int, 1, MAX_BATCH), default=16, help="most requests running at once")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu (gloo) or cuda (NCCL)")
    p.add_argument("--threads", type=_ranged(int, 1, MAX_THREADS), default=1,
                   help="torch CPU threads per rank of this node (1 keeps P ranks from oversubscribing the cores)")
    p.add_argument("--timeout", type=_ranged(float, 1.0), default=600.0,
                   help="seconds before this node abandons the run (including waiting for the other nodes)")
    add_node_args(p)
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: prompt ids, tokens, finish reasons, text (with a tokenizer), modes, "
                        "collectives")
    return p


def _encode_prompts(parser: argparse.ArgumentParser, items: list[tuple[str, Any]], tokenizer: Any, chat: bool,
                    vocab: int) -> list[tuple[int, ...]]:
    """Token ids of every --prompt / --prompt-ids, in command-line order; a bad one ends with argparse's exit 2."""
    prompts = []
    for kind, value in items:
        try:
            ids = value if kind == "ids" else tokenizer.encode_chat(value) if chat else tokenizer.encode(value)
        except ValueError as exc:
            parser.error(f"--prompt {value!r}: {exc}")
        if not ids:
            parser.error(f"--prompt {value!r} encodes to no tokens")
        bad = [t for t in ids if t >= vocab]
        if bad:
            parser.error(f"prompt {list(ids)}: token id {bad[0]} outside the vocabulary 0..{vocab - 1}")
        prompts.append(tuple(ids))
    return prompts


def generate_main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.checkpoint is not None and args.vocab is not None:
        parser.error("--vocab applies to the random model only; a checkpoint brings its own vocab")
    if args.prompts is not None and args.prompt_items:
        parser.error("--prompts N makes random prompts; it does not combine with --prompt/--prompt-ids")
    texts = [value for kind, value in args.prompt_items if kind == "text"]
    if texts and args.checkpoint is None:
        parser.error("--prompt needs --checkpoint (a text prompt is encoded with the checkpoint's tokenizer.json)")
    if args.chat and not texts:
        parser.error("--chat applies to --prompt TEXT")
    nodes = nodes_from_args(parser, args, args.tp)
    local = nodes.ranks(args.tp) if nodes is not None else range(args.tp)

    import torch

    from gatherwise.engine_hooks.sampling import SamplingParams
    from gatherwise.tp_engine.hf_config import eos_token_ids
    from gatherwise.tp_engine.launch import LaunchError, launch
    from gatherwise.tp_engine.runner import GenerateSpec, ModelSpec, generate_rank
    from gatherwise.tp_engine.tokenizer import CheckpointTokenizer

    model = ModelSpec(vocab=args.vocab or 32000, checkpoint=args.checkpoint, weights_seed=args.weights_seed,
                      compute_dtype=args.compute_dtype, device=args.device)
    tokenizer = None
    try:
        config = model.config_and_source()[0]
        stop_ids = eos_token_ids(args.checkpoint) if args.checkpoint is not None and not args.ignore_eos else ()
        if args.checkpoint is not None:
            tokenizer = CheckpointTokenizer.of(args.checkpoint)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        parser.error(f"--checkpoint {args.checkpoint}: {exc}")
    if texts and tokenizer is None:
        parser.error(f"--prompt needs a tokenizer.json in the checkpoint directory {args.checkpoint}")
    prompts = _encode_prompts(parser, args.prompt_items, tokenizer, args.chat, config.vocab_size)
    spec = GenerateSpec(model=model, mode=args.mode, num_prompts=args.prompts or GenerateSpec.num_prompts,
                        max_new_tokens=args.max_new_tokens, seed=args.seed,
                        params=SamplingParams(args.temperature, args.top_k, args.top_p, args.seed),
                        logits_dtype=args.dtype, max_batch=args.max_batch, prompts=tuple(prompts),
                        stop_ids=tuple(stop_ids))
    if args.tp > config.num_heads:
        parser.error(f"--tp {args.tp} exceeds the model's {config.num_heads} attention heads")
    if args.device == "cuda" and len(local) > torch.cuda.device_count():
        parser.error(f"--tp {args.tp} needs {len(local)} GPUs on this node, {torch.cuda.device_count()} visible")
    try:
        if args.tp == 1 and args.device == "cpu":
            torch.set_num_threads(args.threads)
            results = [generate_rank(0, 1, spec)]  # P=1 runs in-process: same code path, no process group
        else:
            results = launch(generate_rank, args.tp, spec, device=args.device, timeout=args.timeout,
                             threads_per_rank=args.threads, nodes=nodes)
    except (LaunchError, ValueError, FileNotFoundError, KeyError) as exc:
        print(f"gatherwise generate: error: {exc}", file=sys.stderr)
        return 1
    if nodes is not None and nodes.rank != 0:  # rank 0's node prints the tokens; this one only ran its share
        print(json.dumps({"node_rank": nodes.rank, "nnodes": nodes.count, "ranks": list(local)}) if args.json
              else f"gatherwise generate: {nodes.describe(args.tp)} done; node 0 prints the tokens")
        return 0
    tokens = [results[0].tokens[i] for i in sorted(results[0].tokens)]
    if not prompts:  # the random prompts the ranks drew: the same pure function of the seed, redrawn here
        from gatherwise.tp_engine.scheduler import make_requests

        prompts = [r.prompt for r in make_requests(spec.num_prompts, config.vocab_size, spec.max_new_tokens,
                                                   spec.seed)]
    reasons = ["stop" if toks and toks[-1] in stop_ids else "length" for toks in tokens]
    texts_out = [tokenizer.decode(toks) for toks in tokens] if tokenizer is not None else None
    if args.json:
        out = {"prompt_ids": [list(p) for p in prompts], "tokens": tokens, "finish_reasons": reasons}
        if texts_out is not None:
            out["text"] = texts_out
        out.update(modes=[r.modes for r in results], collectives=[r.collectives for r in results])
        if len(local) < args.tp:  # per-rank lists cover this node's ranks only: say which
            out["ranks"] = list(local)
        print(json.dumps(out))
        return 0
    first = results[0]
    print(f"tp={args.tp} mode={args.mode} requests={len(tokens)} logits calls={len(first.modes)} "
          f"batch sizes {min(first.batch_sizes)}..{max(first.batch_sizes)}")
    for i, toks in enumerate(tokens):
        shown = " ".join(map(str, toks[:SHOWN_TOKENS])) + (" ..." if len(toks) > SHOWN_TOKENS else "")
        print(f"  request {i:3d}: {len(toks):3d} tokens ({reasons[i]})  {shown}")
        if texts_out is not None:
            print(f"               {json.dumps(texts_out[i], ensure_ascii=False)}")
    for mode in sorted(set(first.modes)):
        print(f"  {mode}: {first.modes.count(mode)} calls")
    agree = all(r.modes == first.modes for r in results)
    where = f"all {len(results)} ranks" if len(local) == args.tp else f"node 0's ranks 0..{local.stop - 1}"
    print(f"  modes identical on {where}: {agree}")
    return 0

