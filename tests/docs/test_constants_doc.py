"""Constants the docs state by name (`NAME` = value) against the code that defines them."""

from __future__ import annotations

import re

from gatherwise.engine_hooks.deferred_word import ADOPT_LAG
from gatherwise.modes import NUM_BUCKETS
from gatherwise.shm_format.control import RESERVED_LIMIT
from tests.docs.markdown import DOCS, ROOT

CONSTANTS = {"ADOPT_LAG": ADOPT_LAG, "NUM_BUCKETS": NUM_BUCKETS, "RESERVED_LIMIT": RESERVED_LIMIT}


def constant_differences(text: str) -> list[str]:
    """Every "`NAME` = value" (or "NAME = value") a doc states for a constant of CONSTANTS, where the value differs."""
    return [f"{name} = {value}: the code's {CONSTANTS[name]}"
            for name, value in re.findall(rf"`?({'|'.join(CONSTANTS)})`?\s*=\s*(\d+)", text)
            if int(value) != CONSTANTS[name]]


def test_the_constants_the_docs_state_are_the_codes():
    for doc in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        assert constant_differences(doc.read_text(encoding="utf-8")) == [], doc.name


def test_a_planted_constant_is_found():
    assert constant_differences("every rank adopts it `ADOPT_LAG` = 1 call later") == ["ADOPT_LAG = 1: the code's 2"]
