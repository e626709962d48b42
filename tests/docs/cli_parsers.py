"""Every `gatherwise` command's argument parser, found the way users find the commands: the entry points
(gatherwise.commands), so a new command is covered without a list kept here.

A command builds its parser inside its entry function; `parser_of` runs that function and stops it at its first
parse, taking the parser it parses with. Subcommands are argparse subparsers, or the names in the entry's module's
`SUBCOMMANDS` table (name -> the function it hands the rest of its arguments to, before it parses).
"""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

from gatherwise.commands import commands


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def parser_of(entry: Any, argv: list[str]) -> argparse.ArgumentParser:
    """The parser `entry(argv)` parses its arguments with (nothing after the parse runs)."""
    def stop(self: argparse.ArgumentParser, *_args: Any, **_kwargs: Any) -> Any:
        raise _Parsed(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_known_args", stop):
        try:
            entry(argv)
        except _Parsed as parsed:
            return parsed.parser
    raise AssertionError(f"{entry.__module__}.{entry.__name__}({argv}) parsed no arguments")


def dispatch_words(entry: Any) -> list[str]:
    """Words the entry function hands to another command before parsing: its module's `SUBCOMMANDS` table."""
    return list(getattr(inspect.getmodule(entry), "SUBCOMMANDS", {}))


@dataclass(frozen=True)
class Option:
    strings: tuple[str, ...]  # e.g. ("-o", "--out")
    default: Any
    takes_value: bool


@dataclass(frozen=True)
class CommandParser:
    name: str  # "mode set", "bench serve"
    parser: argparse.ArgumentParser

    def options(self) -> list[Option]:
        return [Option(tuple(a.option_strings), a.default, a.nargs != 0)
                for a in self.parser._actions
                if a.option_strings and not isinstance(a, argparse._HelpAction)]


def _subparsers(name: str, parser: argparse.ArgumentParser) -> Iterator[CommandParser]:
    yield CommandParser(name, parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for word, sub in action.choices.items():
                yield from _subparsers(f"{name} {word}", sub)


def command_parsers() -> list[CommandParser]:
    """Every command and subcommand with its parser, by name."""
    found: list[CommandParser] = []
    for name, command in commands().items():
        entry = command.load()
        found.extend(_subparsers(name, parser_of(entry, [])))
        for word in dispatch_words(entry):
            found.extend(_subparsers(f"{name} {word}", parser_of(entry, [word])))
    return found
