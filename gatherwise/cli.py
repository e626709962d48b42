"""`gatherwise` command line: runs the subcommand each floor declares (gatherwise.commands), importing only it.

Importing only the chosen command keeps `gatherwise sidecar` and `gatherwise mode` free of torch, and the engine's
commands free of the web stack. A command whose extra is not installed ends with one line naming that extra.
"""

from __future__ import annotations

import sys

from gatherwise.commands import commands
from gatherwise.missing_extra import extra_providing

MISSING_EXTRA_EXIT = 2  # a usage problem, like argparse's: the install lacks what the command needs


def _usage(available: dict) -> str:
    width = max(map(len, available), default=0)
    lines = [f"  {name.ljust(width)}  {command.help_line()}" for name, command in available.items()]
    return "usage: gatherwise COMMAND [ARGS]\n\ncommands:\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    available = commands()
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in available:
        print(_usage(available), file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    name, args = argv[0], argv[1:]
    try:
        return int(available[name].load()(args) or 0)
    except ModuleNotFoundError as exc:
        extra = extra_providing(exc.name or "")
        if extra is None:
            raise
        print(f"gatherwise {name}: needs the '{extra}' extra (No module named {exc.name!r}); "
              f"install it with: pip install 'gatherwise[{extra}]'", file=sys.stderr)
        return MISSING_EXTRA_EXIT


if __name__ == "__main__":
    sys.exit(main())
