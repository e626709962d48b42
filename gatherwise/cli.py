"""`gatherwise` command line: dispatches to each subcommand's module, imported lazily.

Lazy imports keep `gatherwise sidecar` and `gatherwise mode` free of torch.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "generate": ("gatherwise.tp_engine.cli", "generate_main", "run the TP engine on prompts and print tokens as JSON"),
    "engine": ("gatherwise.tp_engine.cli", "engine_main", "run the TP engine with hooks under a synthetic load"),
    "sidecar": ("gatherwise.sidecar.cli", "main", "serve metrics, traces and the control API"),
    "mode": ("gatherwise.sidecar.mode_cli", "main", "get or set the logits mode through the sidecar's HTTP API"),
    "bench": ("gatherwise.bench.cli", "main", "sweep the logits path: which mode wins where"),
    "demo": ("gatherwise.sidecar.demo", "main", "engine + sidecar (+ Prometheus) with a live terminal view"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        width = max(map(len, COMMANDS))
        lines = [f"  {name.ljust(width)}  {help_}" for name, (_, _, help_) in COMMANDS.items()]
        print("usage: gatherwise COMMAND [ARGS]\n\ncommands:\n" + "\n".join(lines), file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module, func, _ = COMMANDS[argv[0]]
    return int(getattr(importlib.import_module(module), func)(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
