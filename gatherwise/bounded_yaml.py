"""YAML from files and environment values that someone else may have written: bounded, and without aliases.

A config file or table file is read only if it is a regular file of at most MAX_YAML_BYTES (a FIFO, /dev/zero
or a huge file is refused before it is read; the open never blocks), and YAML aliases are refused: a few hundred
bytes of nested aliases ("billion laughs") expand to gigabytes. Symlinks are followed (a Kubernetes ConfigMap
is mounted as links). Every message quotes at most a short prefix of what it refuses (`short`).
pyyaml only: the engine side imports this module too.
"""

from __future__ import annotations

import os
import stat
import sys
from typing import Any

import yaml

MAX_YAML_BYTES = 256 * 1024  # a config or table file is a few KiB
MAX_QUOTED_CHARS = 80  # of a value quoted in an error message


class YAMLInputError(ValueError):
    """The file or text is not YAML this reader takes: `where` (the file, or "" for text) and `reason`."""

    def __init__(self, reason: str, where: str = "") -> None:
        super().__init__(f"{where}: {reason}" if where else reason)
        self.reason, self.where = reason, where


class NotUTF8Error(YAMLInputError):
    """The file's bytes are not UTF-8."""


class _NoAliasLoader(yaml.SafeLoader):
    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, f"found alias *{event.anchor}: YAML aliases are not "
                                              "accepted", event.start_mark)
        return super().compose_node(parent, index)


def short(value: Any) -> str:
    """repr(value), cut to MAX_QUOTED_CHARS characters."""
    text = repr(value)
    return text if len(text) <= MAX_QUOTED_CHARS else f"{text[:MAX_QUOTED_CHARS]}... ({len(text)} characters)"


def short_message(text: str) -> str:
    """A message cut to a few times MAX_QUOTED_CHARS (messages of validators may quote what they refuse)."""
    limit = 4 * MAX_QUOTED_CHARS
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def parse_yaml(text: str) -> Any:
    """The YAML document in `text`; YAMLInputError (first line of the parser's message) when it is not one."""
    try:
        return yaml.load(text, Loader=_NoAliasLoader)
    except yaml.YAMLError as exc:
        raise YAMLInputError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    except RecursionError:
        raise YAMLInputError("nested too deeply") from None
    except ValueError as exc:  # a scalar's constructor refused it (int() beyond Python's digit limit, a bad date)
        raise YAMLInputError(_scalar_problem(exc)) from None


def _scalar_problem(exc: ValueError) -> str:
    if "integer string conversion" in str(exc):  # int()'s hint to raise the limit is no advice for a config
        return f"an integer has more than {sys.get_int_max_str_digits()} digits"
    return short(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


def read_yaml_file(path: str | os.PathLike[str], limit: int = MAX_YAML_BYTES) -> Any:
    """The YAML document in file `path` (UTF-8, a regular file of at most `limit` bytes).
    OSError when it cannot be opened; YAMLInputError for everything else, naming the file."""
    path = os.fspath(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise YAMLInputError("not a regular file", path)
        if st.st_size > limit:
            raise YAMLInputError(f"{st.st_size} bytes, larger than the {limit} a YAML file may have", path)
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise YAMLInputError(f"larger than the {limit} bytes a YAML file may have", path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotUTF8Error(f"not UTF-8 text (byte {exc.start}): a YAML file must be UTF-8", path) from None
    try:
        return parse_yaml(text)
    except YAMLInputError as exc:
        raise YAMLInputError(f"not valid YAML: {exc.reason}", path) from None
