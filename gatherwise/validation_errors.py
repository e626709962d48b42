"""How a pydantic validation error becomes a message, for every reader of outside input: configuration files
and variables (gatherwise.config), table files (gatherwise.table_file), the sidecar's saved decision state and
the control API's request bodies. pydantic only: the engine side imports this module too.

Why one module: pydantic words a validator's own ValueError as "Value error, <message>" and locates an error as a
tuple of keys and indexes; each reader names the place in its own terms (a file and key, a dotted path, a JSON
pointer-like list), but the message of a validator is always shown in the validator's words.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

VALUE_ERROR_PREFIX = "Value error, "  # what pydantic puts before the message of a validator's ValueError
MAX_DECODER_REASON_CHARS = 200


def error_text(error: ErrorDetails | dict[str, Any]) -> str:
    """The error's message, a validator's ValueError in its own words."""
    return str(error.get("msg", "")).removeprefix(VALUE_ERROR_PREFIX)


def dotted_location(loc: Iterable[Any], empty: str = "") -> str:
    """("params", "window") -> "params.window"; `empty` for an error of the whole document."""
    return ".".join(map(str, loc)) or empty


def joined_errors(exc: ValidationError, explain: Callable[[ErrorDetails], str], separator: str = "; ") -> str:
    """Every error of `exc`, each as `explain` words it, in pydantic's order."""
    return separator.join(explain(e) for e in exc.errors())


def request_error_text(error: ErrorDetails | dict[str, Any]) -> str:
    """pydantic's message for a request body; for a body that is no JSON, with the decoder's reason (e.g. the
    repeated key)."""
    message = str(error.get("msg", ""))
    reason = (error.get("ctx") or {}).get("error") if error.get("type") == "json_invalid" else None
    return f"{message}: {str(reason)[:MAX_DECODER_REASON_CHARS]}" if reason else message


def request_error_details(errors: Iterable[ErrorDetails | dict[str, Any]]) -> list[dict[str, Any]]:
    """A 422 body's `detail`: location, message and type of each error, and never the input (an input like NaN
    cannot be encoded as JSON)."""
    return [{"loc": list(e.get("loc", ())), "msg": request_error_text(e), "type": str(e.get("type", ""))}
            for e in errors]
