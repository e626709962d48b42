"""The demo's terminal view of the engine's newest output (dashboards/demo.py `sample_lines`): the model, the
prompt and the generated text from GET /v1/live, clipped to the terminal and printable whatever the engine wrote."""

from __future__ import annotations

from typing import Any

from gatherwise.dashboards.demo import sample_lines

SAMPLE: dict[str, Any] = {"prompt": "What is\ntensor parallelism?", "text": "It splits each layer across devices.",
                          "tokens": 7, "wall_ns": 1, "age_seconds": 3.2}
LIVE: dict[str, Any] = {"engine": {"model": "SmolLM2-135M-Instruct"}, "sample": SAMPLE}


def test_the_latest_output_names_the_model_prompt_text_tokens_and_age():
    head, text = sample_lines(LIVE, 200)
    assert head == "latest output (SmolLM2-135M-Instruct, 7 tokens, 3 s ago): What is tensor parallelism?"
    assert text == "  → It splits each layer across devices."


def test_each_line_is_clipped_to_the_width():
    live = {**LIVE, "sample": {**SAMPLE, "text": "word " * 500}}
    lines = sample_lines(live, 60)
    assert all(len(line) <= 60 for line in lines) and lines[1].endswith("…")


def test_the_engines_control_and_escape_characters_never_reach_the_terminal():
    hostile = "\x1b[2J\x1b]0;owned\x07red\u202eevil\r\nnext"
    live = {"engine": {"model": hostile}, "sample": {**SAMPLE, "prompt": hostile, "text": hostile}}
    for line in sample_lines(live, 500):
        assert not any(c in line for c in "\x1b\x07\r\n\u202e"), repr(line)
        assert "red" in line and "evil" in line


def test_no_sample_and_no_model_say_so():
    assert sample_lines({"engine": {"model": None}, "sample": None}, 200) == \
        ["latest output (model not named): none (this engine writes no sample)"]
    assert sample_lines({"engine": None, "sample": None}, 20)[0].endswith("…")
