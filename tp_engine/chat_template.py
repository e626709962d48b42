"""Render a checkpoint's Jinja chat template for one user message, the way transformers does.

Same environment as transformers' `apply_chat_template`: a sandbox (templates come with downloaded checkpoints
and are untrusted), `trim_blocks`/`lstrip_blocks`, loop controls, a `tojson` filter that does not escape
HTML, and the `raise_exception` and `strftime_now` helpers. Needs jinja2 (`pip install jinja2`, part of the
`engine` extra). Templates with transformers' `{% generation %}` tag (training masks) are not supported.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any


def render_chat(template: str, user_text: str, special_tokens: dict[str, str]) -> str:
    """The prompt text for one user turn, ending where the assistant's reply begins."""
    try:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as exc:  # pragma: no cover - jinja2 comes with the engine extra
        raise RuntimeError("rendering a chat template needs jinja2: pip install jinja2") from exc

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        compiled = env.from_string(template)
        return compiled.render(messages=[{"role": "user", "content": user_text}], add_generation_prompt=True,
                               tools=None, documents=None, **special_tokens)
    except jinja2.exceptions.TemplateError as exc:
        raise ValueError(f"chat template failed: {exc}") from None
