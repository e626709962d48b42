"""Argument types shared by the bench commands (`gatherwise bench` and `gatherwise bench serve`): comma-separated
lists and bounded integers, each failing with argparse's usage line and the option it belongs to.
"""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Callable


def int_list(what: str, minimum: int) -> Callable[[str], tuple[int, ...]]:
    def parse(text: str) -> tuple[int, ...]:
        items = [t.strip() for t in text.split(",")]
        if not text.strip() or any(not t for t in items):
            raise argparse.ArgumentTypeError(f"{what}: expected a comma-separated list like 1,2,4, got {text!r}")
        values = []
        for t in items:
            try:
                values.append(int(t))
            except ValueError:
                raise argparse.ArgumentTypeError(f"{what}: {t!r} is not an integer") from None
        bad = [v for v in values if v < minimum]
        if bad:
            raise argparse.ArgumentTypeError(f"{what} must be >= {minimum}, got {bad[0]}")
        return tuple(sorted(set(values)))

    return parse


def name_list(what: str, parse_one: Callable[[str], str]) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        items = [t.strip() for t in text.split(",")]
        if not text.strip() or any(not t for t in items):
            raise argparse.ArgumentTypeError(f"{what}: expected a comma-separated list, got {text!r}")
        out: list[str] = []
        for t in items:
            try:
                name = parse_one(t)
            except ValueError as exc:
                raise argparse.ArgumentTypeError(f"{what}: {exc}") from None
            if name not in out:
                out.append(name)
        return tuple(out)

    return parse


def at_least(what: str, minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what}: {text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{what} must be >= {minimum}, got {value}")
        return value

    return parse


def interpreter(text: str) -> str:
    """An interpreter as an absolute path (a bare name is looked up on PATH): the servers and clients it runs start
    in their own work directories, where a path relative to the caller's would name nothing."""
    found = shutil.which(text)
    if found is None:
        raise argparse.ArgumentTypeError(f"--python: no executable interpreter at {text!r}")
    return os.path.abspath(found)
