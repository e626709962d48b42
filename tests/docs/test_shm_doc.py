"""docs/shm-format.md against the shared-memory code: the ring header and record tables (offset, type, field)
against the structs and their field names, the counter and drop areas, the operations by mode, the control
block's areas, every format version, the JSON files' fields, and sidecar-state.json's version and keys."""

from __future__ import annotations

import dataclasses
import re
import struct
from collections.abc import Iterator

from gatherwise.modes import Mode
from gatherwise.shm_format import control, engine_info, engine_sample, hooks_off, node_ranks, ring
from gatherwise.sidecar.policy.saved_state import READ_VERSIONS, STATE_VERSION, PolicyState
from tests.docs.markdown import code_spans, read, table

DOC = "docs/shm-format.md"
TYPES = {"Q": "u64", "I": "u32", "H": "u16", "B": "u8"}


def _layout(fmt: str, names: tuple[str, ...], base: int = 0) -> Iterator[tuple[int, str, str]]:
    """(offset, type as the doc writes it, field) of a little-endian struct without padding."""
    offset = base
    for code, name in zip(re.findall(r"\d*[A-Za-z]", fmt.lstrip("<")), names, strict=True):
        yield offset, f"{code[:-1]} bytes" if code.endswith("s") else TYPES[code], name
        offset += struct.calcsize("<" + code)


def header_layout() -> list[tuple[int, str, str]]:
    words = ring.COUNTERS.size // ring.WORD_BYTES
    return [*_layout(ring.HEADER_FIXED.format, ring.HEADER_FIXED_FIELDS),
            (ring.TOPP_ROWS_OFFSET, "u64", "topp_rows"), (ring.TOPP_FALLBACK_ROWS_OFFSET, "u64", "topp_fallback_rows"),
            (ring.COUNTERS_OFFSET, f"u64 × {words}", "counters"),
            (ring.DROPS_OFFSET, f"u64 × {len(ring.DROP_REASONS)}", "drops")]


def record_layout() -> list[tuple[int, str, str]]:
    return list(_layout(ring.RECORD.format, ring.RECORD_FIELD_NAMES))


def _documented_layout(text: str, heading: str) -> list[tuple[int, str, str]]:
    return [(int(row["offset"]), row["type"], row["field"]) for row in table(text, heading, "offset").rows
            if row["field"] != "reserved"]


def _version(pattern: str, text: str) -> int | None:
    found = re.search(pattern, text)
    return int(found.group(1)) if found else None


def shm_differences(text: str) -> list[str]:
    out = []

    def same(what: str, documented: object, code: object) -> None:
        if documented != code:
            out.append(f"{what}: documented {documented!r}, the code's {code!r}")

    # the ring: layout, sizes, version
    same("ring header layout", _documented_layout(text, "Header (bytes"), header_layout())
    same("ring record layout", _documented_layout(text, "Record ("), record_layout())
    same("ring header size", _version(r"### Header \(bytes 0–(\d+)\)", text), ring.HEADER_SIZE - 1)
    same("ring record size", _version(r"### Record \((\d+) bytes", text), ring.RECORD_SIZE)
    same("ring format version (heading)", _version(r"## Telemetry ring .*, format version (\d+)", text),
         ring.FORMAT_VERSION)
    version_row = [r for r in table(text, "Header (bytes", "offset").rows if r["field"] == "version"]
    same("ring format version (header table)", _version(r"\*\*(\d+)\*\*", version_row[0]["meaning"]),
         ring.FORMAT_VERSION)
    same("ring format version (reader's refusal)", _version(r"understands only\s+version (\d+)", text),
         ring.FORMAT_VERSION)
    # counters: one row per mode, word 0 the calls, then (ns, bytes) per op in OPS order
    width = 1 + 2 * len(ring.OPS)
    rows_words = re.search(r"(\d+) rows × (\d+) words", text)
    same("counter rows × words", rows_words.groups() if rows_words else None, (str(ring.NUM_MODE_ROWS), str(width)))
    counter_words = {row["word"]: code_spans(row["counter"])[:1] if row["word"] != "0" else row["counter"]
                     for row in table(text, "", "word", "counter").rows}
    same("counter words", counter_words,
         {"0": "calls in mode `m`", **{f"{1 + 2 * i}, {2 + 2 * i}": [op] for i, op in enumerate(ring.OPS)}})
    drops_row = next(r for r in table(text, "Header (bytes", "offset").rows if r["field"] == "drops")
    same("drop reasons", tuple(code_spans(drops_row["meaning"])), ring.DROP_REASONS)
    # operations by mode
    ops = {}
    for row in table(text, "", "mode", "first collective (record: collective fields)").rows:
        label, code = re.fullmatch(r"(\w+) \((\d)\)", row["mode"]).groups()  # type: ignore[union-attr]
        second = code_spans(row["second operation (record: second-operation fields)"])[:1]
        ops[(label, int(code))] = (code_spans(row["first collective (record: collective fields)"])[0],
                                   second[0] if second else None)
    same("operations by mode", ops, {(Mode(m).label, int(m)): o for m, o in ring.MODE_OPS.items()})
    # the control block
    same("control format version", _version(r"## Control block .*, format version (\d+)", text),
         control.FORMAT_VERSION)
    areas = {row["area"]: (row["bytes"].split("–")[0], len(row["u64 words"].split("·")))
             for row in table(text, "Control block", "area").rows if row["area"] != "reserved"}
    same("control block areas (first byte, words)", areas, {
        "header": ("0", control.HEADER.size // ring.WORD_BYTES),
        "heartbeat": (str(control.HB_LOCK * ring.WORD_BYTES), 1 + control.HEARTBEAT_FIELDS),
        "command": (str(control.CMD_LOCK * ring.WORD_BYTES), 1 + control.COMMAND_FIELDS),
        "status": (str(control.ST_LOCK * ring.WORD_BYTES), 1 + control.STATUS_FIELDS)})
    # the JSON files: heading's format, the example's format and keys
    for heading, module, record in (("Hooks-off notice", hooks_off, hooks_off.HooksOffNotice),
                                    ("Rank info", engine_info, engine_info.RankInfo),
                                    ("Sample", engine_sample, engine_sample.EngineSample),
                                    ("Node file", node_ranks, node_ranks.NodeRanks)):
        section = re.search(rf"## {heading}.*?, format (\d+)\n(.*?)(?=\n## )", text, re.S)
        if section is None:
            out.append(f"{heading}: no section")
            continue
        same(f"{heading} format (heading)", int(section.group(1)), module.FORMAT)
        example = re.search(r"\{\"format\": (\d+),(.*?)\}", section.group(2), re.S)
        if example is None:
            out.append(f"{heading}: no example object")
            continue
        same(f"{heading} format (example)", int(example.group(1)), module.FORMAT)
        keys = re.findall(r"\"(\w+)\"(?=\s*[:,}]|$)", "{" + example.group(2) + "}")
        keys = [k for k in keys if not re.search(rf":\s*\"{k}\"", example.group(2))]  # values are no keys
        same(f"{heading} keys", sorted(keys), sorted(f.name for f in dataclasses.fields(record)))
    notice = re.search(r"`reason` one of (.*?)\(a reader", text, re.S)
    same("hooks-off reasons", tuple(code_spans(notice.group(1))) if notice else None, hooks_off.REASONS)
    # sidecar-state.json
    state = re.search(r"is\n?\s*`(\{\"version\": (\d+),.*?\})`", text, re.S)
    if state is None:
        out.append("sidecar-state.json: no document")
    else:
        same("sidecar-state.json version", int(state.group(2)), STATE_VERSION)
        same("sidecar-state.json keys", sorted(re.findall(r"\"(\w+)\"", state.group(1))),
             sorted(PolicyState.model_fields))
    read_versions = re.search(r"a version other than (\d+(?: or \d+)*)", text)
    same("sidecar-state.json versions read",
         tuple(int(v) for v in read_versions.group(1).split(" or ")) if read_versions else None, READ_VERSIONS)
    return out


def test_the_shared_memory_doc_is_the_code():
    assert shm_differences(read(DOC)) == []


def test_a_planted_layout_version_and_key_are_found():
    text = read(DOC)
    assert shm_differences(text.replace("| 8 | u32 | version | format version, **2** |",
                                        "| 8 | u32 | version | format version, **1** |")) == [
        f"ring format version (header table): documented 1, the code's {ring.FORMAT_VERSION}"]
    moved = shm_differences(text.replace("| 44 | u16 | rank | TP rank |", "| 44 | u32 | rank | TP rank |"))
    assert len(moved) == 1 and moved[0].startswith("ring record layout")
    assert shm_differences(text.replace('"seconds_total", ', "")) == [
        "sidecar-state.json keys: documented " + repr(sorted(set(PolicyState.model_fields) - {"seconds_total"}))
        + f", the code's {sorted(PolicyState.model_fields)!r}"]
    assert shm_differences(text.replace("## Control block (`control`), format version 1",
                                        "## Control block (`control`), format version 2")) == [
        f"control format version: documented 2, the code's {control.FORMAT_VERSION}"]
    assert shm_differences(text.replace('"node_index": 1, ', "")) == [
        "Node file keys: documented ['node', 'nodes', 'ranks', 'tp_size'], "
        "the code's ['node', 'node_index', 'nodes', 'ranks', 'tp_size']"]
