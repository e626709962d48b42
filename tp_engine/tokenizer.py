"""A checkpoint's own tokenizer: `tokenizer.json` through the `tokenizers` library, and its chat template.

Plain prompts are encoded with the tokenizer's special tokens (its post-processor adds BOS where the model
expects one), exactly like transformers' `tokenizer(text)`. Chat prompts are rendered with the template from
`chat_template.jinja` or `tokenizer_config.json` and encoded without adding special tokens (the template
writes them), exactly like transformers' `apply_chat_template(..., tokenize=True)`.
"""

from __future__ import annotations

import json
from pathlib import Path

from gatherwise.tp_engine.chat_template import render_chat

_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


class CheckpointTokenizer:
    def __init__(self, checkpoint_dir: str | Path) -> None:
        from tokenizers import Tokenizer

        self.directory = Path(checkpoint_dir)
        path = self.directory / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer.json in checkpoint directory {checkpoint_dir}")
        self._tokenizer = Tokenizer.from_file(str(path))
        config_path = self.directory / "tokenizer_config.json"
        self._config: dict = json.loads(config_path.read_text()) if config_path.is_file() else {}

    @classmethod
    def of(cls, checkpoint_dir: str | Path) -> CheckpointTokenizer | None:
        """The checkpoint's tokenizer, or None when it ships no tokenizer.json."""
        return cls(checkpoint_dir) if (Path(checkpoint_dir) / "tokenizer.json").is_file() else None

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=True).ids

    def encode_chat(self, user_text: str) -> list[int]:
        return self._tokenizer.encode(self.render_chat(user_text), add_special_tokens=False).ids

    def render_chat(self, user_text: str) -> str:
        return render_chat(self.chat_template(), user_text, self._special_tokens())

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def has_chat_template(self) -> bool:
        try:
            self.chat_template()
        except ValueError:
            return False
        return True

    def chat_template(self) -> str:
        """chat_template.jinja, else tokenizer_config.json's `chat_template` (a string, or named templates)."""
        path = self.directory / "chat_template.jinja"
        if path.is_file():
            return path.read_text()
        template = self._config.get("chat_template")
        if isinstance(template, list):  # [{"name": ..., "template": ...}]: transformers uses the "default" one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if not isinstance(template, str):
            raise ValueError(f"checkpoint {self.directory} has no chat template (chat_template.jinja or "
                             f"tokenizer_config.json's chat_template)")
        return template

    def _special_tokens(self) -> dict[str, str]:
        tokens = {}
        for name in _SPECIAL_TOKENS:
            value = self._config.get(name)
            if isinstance(value, dict):  # a serialized AddedToken
                value = value.get("content")
            if isinstance(value, str):
                tokens[name] = value
        return tokens
