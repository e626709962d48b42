"""config/gatherwise.yaml states every key with its default: checked against the schema (gatherwise/config.py) both
ways, and every `section.key` the docs name is a key of the schema."""

from __future__ import annotations

import re
from typing import Any

import yaml

from gatherwise.config import SECTIONS
from tests.docs.markdown import DOCS, ROOT, read

DOCUMENTED = "config/gatherwise.yaml"


def _plain(value: Any) -> Any:
    """A default as YAML states it (a tuple is a list; a schema object its fields)."""
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if hasattr(value, "model_dump"):
        return value.model_dump()
    return value


def config_differences(text: str) -> list[str]:
    """What the documented YAML says that the schema does not: keys either side lacks, defaults that differ."""
    documented = yaml.safe_load(text) or {}
    out = []
    for section in sorted(set(documented) | set(SECTIONS)):
        if section not in SECTIONS:
            out.append(f"{section}: documented, but no section of the schema")
            continue
        if section not in documented:
            out.append(f"{section}: a section of the schema, not documented")
            continue
        defaults = SECTIONS[section]()
        keys = documented[section] or {}
        for key in sorted(set(keys) | set(SECTIONS[section].model_fields)):
            where = f"{section}.{key}"
            if key not in SECTIONS[section].model_fields:
                out.append(f"{where}: documented, but no key of the schema")
            elif key not in keys:
                out.append(f"{where}: a key of the schema, not documented")
            elif _plain(keys[key]) != _plain(getattr(defaults, key)):
                out.append(f"{where}: documented default {keys[key]!r}, the schema's {getattr(defaults, key)!r}")
    return out


KEY_MENTION = re.compile(rf"`({'|'.join(SECTIONS)})\.([a-z_]+)`")
FILE_SUFFIXES = {"py", "md", "yaml", "yml", "json"}  # `control.py` names a file, not a key


def unknown_key_mentions(text: str) -> list[str]:
    """`section.key` code spans that name no key of the schema."""
    return sorted({f"{s}.{k}" for s, k in KEY_MENTION.findall(text)
                   if k not in SECTIONS[s].model_fields and k not in FILE_SUFFIXES})


def test_the_documented_config_is_the_schema():
    assert config_differences(read(DOCUMENTED)) == []


def test_every_config_key_the_docs_name_exists():
    for doc in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        assert unknown_key_mentions(doc.read_text(encoding="utf-8")) == [], doc.name


def test_a_planted_default_a_missing_key_and_an_unknown_key_are_found():
    text = read(DOCUMENTED)
    assert config_differences(text.replace("  port: 9400", "  port: 9401")) == [
        "sidecar.port: documented default 9401, the schema's 9400"]
    without = re.sub(r"\n  every_nth: .*", "", text)
    assert config_differences(without) == ["traces.every_nth: a key of the schema, not documented"]
    extra = text.replace("\ntelemetry:\n", "\ntelemetry:\n  ring_bytes: 4096\n")
    assert config_differences(extra) == ["telemetry.ring_bytes: documented, but no key of the schema"]
    assert unknown_key_mentions("set `sidecar.prot` and `sidecar.port`") == ["sidecar.prot"]
