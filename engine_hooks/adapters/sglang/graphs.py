"""Which decode CUDA graph SGLang captures and replays when gatherwise is on: one graph per (batch size, mode).

SGLang's DecodeCudaGraphRunner keys its graphs by `ShapeKey(size, stream_idx, variant_label, attention_variant)`
and builds every key, at capture and at replay alike, in `_make_graph_key`. The mode becomes one more part of
that key: while a mode is *keyed* (a capture pass, or the replay decided for a step), `_make_graph_key` folds
the mode's label into `variant_label`. SGLang's capture loop runs once per captured mode, the logits gatherer
recording that mode's device work (gatherwise.engine_hooks.logits_path `capturing`); before a replay the host picks the
mode from the table (`LogitsPath.begin_call`, the same on every rank) and keys that mode's graph.

This module holds the bookkeeping only (no SGLang, no torch): what was captured, the keyed mode, which graph a
batch of `rows` replays. The SGLang wiring is in sglang.patches (targets) and sglang.step (the hooks).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from gatherwise.modes import Mode

# The modes a graph can hold: all_gather and gather (engine_hooks.graphs.CAPTURABLE, which imports torch; kept
# in step by tests/engine_hooks/adapters/test_sglang_graphs.py). Sharded decides on the host per call: those steps
# run eagerly.
GRAPH_MODES = (Mode.ALL_GATHER, Mode.GATHER)


def parse_graph_modes(text: str) -> tuple[Mode, ...]:
    """The `engine.graph_modes` setting ("all_gather,gather") as modes, in capture order; refuses the rest."""
    labels = [part.strip() for part in text.split(",") if part.strip()]
    if not labels:
        raise ValueError("engine.graph_modes names no mode: name at least one of all_gather, gather")
    modes = []
    for label in labels:
        mode = Mode.parse(label)
        if mode not in GRAPH_MODES:
            raise ValueError(f"engine.graph_modes: {label!r} cannot be captured in a CUDA graph (capturable: "
                             f"{', '.join(m.label for m in GRAPH_MODES)}); its calls run eagerly anyway")
        if mode not in modes:
            modes.append(mode)
    return tuple(m for m in GRAPH_MODES if m in modes)  # all_gather first: a plain pass is keyed by it


def fold_label(variant_label: str | None, mode: Mode) -> str:
    """SGLang's variant label (LoRA: "lora"/"nolora", or None) with the mode folded in."""
    tag = f"gatherwise:{mode.label}"
    return tag if variant_label is None else f"{variant_label}|{tag}"


class DecodeGraphModes:
    """Capture passes, captured (mode, rows) variants, and the mode folded into graph keys right now."""

    def __init__(self, modes: tuple[Mode, ...]) -> None:
        self.modes = modes  # the modes to capture, in order
        self.passes: list[Mode] = []  # capture passes that ran (empty: SGLang captured no decode graphs)
        self.capturing: Mode | None = None  # the mode of the capture pass in progress
        self.key_mode: Mode | None = None  # folded into every graph key while set
        self._rows: dict[Mode, set[int]] = {}  # batch sizes whose logits exchange the path captured, per mode

    @contextmanager
    def keyed(self, mode: Mode | None) -> Iterator[None]:
        """Graph keys built inside carry `mode` (None: SGLang's own keys)."""
        previous, self.key_mode = self.key_mode, mode
        try:
            yield
        finally:
            self.key_mode = previous

    @contextmanager
    def capture_pass(self, mode: Mode) -> Iterator[None]:
        """One run of SGLang's capture loop, for `mode`."""
        if self.capturing is not None:
            raise RuntimeError("capture passes do not nest")
        self.passes.append(mode)
        self.capturing = mode
        try:
            with self.keyed(mode):
                yield
        finally:
            self.capturing = None

    def note_captured(self, mode: Mode, rows: int) -> None:
        """The logits gatherer recorded `mode`'s exchange for a graph of `rows` rows."""
        self._rows.setdefault(mode, set()).add(rows)

    def captured(self) -> set[tuple[Mode, int]]:
        return {(mode, rows) for mode, sizes in self._rows.items() for rows in sizes}

    def graph_rows(self, mode: Mode, rows: int) -> int | None:
        """The batch size of the `mode` graph a batch of `rows` rows replays (SGLang pads up to the next
        captured size); None when no such graph holds gatherwise's exchange: the step runs eagerly."""
        sizes = [size for size in self._rows.get(mode, ()) if size >= rows]
        return min(sizes) if sizes else None

    def plain_mode(self) -> Mode | None:
        """The key of graphs captured while the hooks were off (they hold SGLang's own all_gather): the first
        pass's mode. Only one pass runs then."""
        return self.passes[0] if self.passes else None
