"""docs/cli.md lists every option of every `gatherwise` command, with its default, and every `gatherwise …` command
line in the docs uses options its command takes: checked against the commands' own parsers (tests/docs/
cli_parsers.py finds them through the entry points, so a new command or option without docs fails here)."""

from __future__ import annotations

import argparse
import re
from functools import cache
from typing import Any

from tests.docs.cli_parsers import CommandParser, command_parsers
from tests.docs.markdown import DOCS, ROOT, read, tables

REFERENCE = "docs/cli.md"
NO_DEFAULT = "—"


@cache
def parsers() -> dict[str, CommandParser]:
    return {command.name: command for command in command_parsers()}


def _default_text(value: Any) -> str | None:
    """A parser default as docs/cli.md writes it; None for no default of its own."""
    if value is None or value is False or value is argparse.SUPPRESS or value == []:
        return None
    if isinstance(value, tuple | list):
        return ",".join(map(str, value))
    return str(value)


def documented_options(text: str) -> dict[str, dict[str, str]]:
    """Command name ("mode set") -> option string -> its default cell, from the tables under the
    `gatherwise <command>` headings."""
    out: dict[str, dict[str, str]] = {}
    for t in tables(text):
        heading = re.fullmatch(r"`gatherwise ([a-z][a-z -]*?)(?: [A-Z][A-Z_ ]*)?`", t.heading)
        if heading is None or t.header[:1] != ("option",):
            continue
        options = out.setdefault(heading.group(1), {})
        for row in t.rows:
            for span in re.findall(r"`(-[^` ]+)[^`]*`", row["option"]):
                options[span] = row["default"]
    return out


def cli_differences(text: str, commands: dict[str, CommandParser]) -> list[str]:
    """Commands, options and defaults where docs/cli.md and the parsers differ."""
    documented = documented_options(text)
    out = []
    for name in sorted(set(documented) | set(commands)):
        if name not in commands:
            out.append(f"gatherwise {name}: documented, but no such command")
            continue
        options = {s: option for option in commands[name].options() for s in option.strings}
        if name not in documented:
            if options:
                out.append(f"gatherwise {name}: a command with options, not documented")
            continue
        for flag in sorted(set(documented[name]) | set(options)):
            if flag not in options:
                out.append(f"gatherwise {name} {flag}: documented, but the command takes no such option")
            elif flag not in documented[name]:
                out.append(f"gatherwise {name} {flag}: an option of the command, not documented")
            else:
                option = options[flag]
                # a flag's default is its own absence: only options that take a value have a default to state
                cell, actual = documented[name][flag], _default_text(option.default) if option.takes_value else None
                stated = re.fullmatch(r"`([^`]*)`", cell)
                if stated and stated.group(1) != actual:
                    out.append(f"gatherwise {name} {flag}: documented default {cell}, the parser's {actual!r}")
                elif cell == NO_DEFAULT and actual is not None:
                    out.append(f"gatherwise {name} {flag}: documented without a default, the parser's {actual!r}")
    return out


COMMAND_LINE = re.compile(r"(?:^|[\s/`(])gatherwise ((?:[a-z][\w-]*)[^`#|;&)\n]*)")
IN_BLOCK = re.compile(r"(?:^|[\s/])gatherwise ((?:[a-z][\w-]*)[^#;&\n]*)")  # `a|b` alternatives are no pipes


def command_texts(text: str) -> list[str]:
    """What follows `gatherwise ` in the docs' code spans, and in their code blocks per logical line (a line ending
    in `\\` or followed by indented `[--…`/`--…` lines continues), so a synopsis over several lines is one."""
    found: list[str] = []
    blocks = re.findall(r"(?ms)^```[^\n]*\n(.*?)^```", text)
    for block in blocks:
        logical: list[str] = []
        for line in block.splitlines():
            if logical and (logical[-1].endswith("\\") or re.match(r"\s+\[?--", line)):
                logical[-1] = logical[-1].rstrip("\\") + " " + line.strip()
            else:
                logical.append(line)
        found += [m.group(1) for line in logical for m in IN_BLOCK.finditer(line)]
    outside = re.sub(r"(?ms)^```[^\n]*\n.*?^```", "", text)
    found += [m.group(1) for m in COMMAND_LINE.finditer(outside)]
    return found


def _children(name: str, commands: dict[str, CommandParser]) -> set[str]:
    return {other.rsplit(" ", 1)[1] for other in commands if other.rsplit(" ", 1)[0] == name and " " in other}


def usage_differences(text: str, commands: dict[str, CommandParser]) -> list[str]:
    """`gatherwise …` command lines (code blocks and code spans) that use an option their command lacks, at the
    place they use it (before a subcommand: the parent's options; after it: the subcommand's)."""
    out = []
    for line in command_texts(text):
        words = line.split()
        if words[0] not in commands:
            continue
        name = words[0]
        for word in (w.strip("[]") for w in words[1:]):
            if word in _children(name, commands):
                name = f"{name} {word}"
            elif re.fullmatch(r"--?[a-z][\w-]*(=.*)?", word):
                flag = word.split("=", 1)[0]
                if flag not in {s for option in commands[name].options() for s in option.strings} | {"-h", "--help"}:
                    out.append(f"`gatherwise {line.strip()}`: gatherwise {name} takes no {flag}")
    return out


def test_every_option_of_every_command_is_documented_with_its_default():
    assert cli_differences(read(REFERENCE), parsers()) == []


def test_every_command_line_in_the_docs_uses_options_its_command_takes():
    for doc in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        assert usage_differences(doc.read_text(encoding="utf-8"), parsers()) == [], doc.name


def test_a_planted_option_default_and_command_line_are_found():
    text = read(REFERENCE)
    before = set(cli_differences(text, parsers()))

    def planted(old: str, new: str) -> list[str]:
        assert old in text
        return sorted(set(cli_differences(text.replace(old, new), parsers())) - before)

    assert planted("| `--log-level LOG_LEVEL` | `info` |", "| `--log-level LOG_LEVEL` | `warning` |") == [
        "gatherwise sidecar --log-level: documented default `warning`, the parser's 'info'"]
    assert planted("| `--shm-dir SHM_DIR` | — | where engines put", "| `--shm SHM_DIR` | — | where engines put") == [
        "gatherwise sidecar --shm-dir: an option of the command, not documented",
        "gatherwise sidecar --shm: documented, but the command takes no such option"]
    assert usage_differences("```\ngatherwise mode get --wait 5\n```", parsers()) == [
        "`gatherwise mode get --wait 5`: gatherwise mode get takes no --wait"]
    assert usage_differences("run `gatherwise mode --wait 5 set gather --buckets 8`", parsers()) == []
    synopsis = "```\ngatherwise bench serve --engine vllm|sglang [--quick]\n    [--passes 2] [--pases 3]\n```"
    assert usage_differences(synopsis, parsers()) == [
        "`gatherwise bench serve --engine vllm|sglang [--quick] [--passes 2] [--pases 3]`: "
        "gatherwise bench serve takes no --pases"]
