"""The hooks-off reasons and step-aside reasons docs/vllm.md and docs/sglang.md name, against what each adapter's
code writes: the reasons its modules pass to `report_hooks_off` / `disable`, and the reasons its step-aside
function returns (read from the source with `ast`, so the adapters stay unimported and unchanged)."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from gatherwise.shm_format.hooks_off import REASONS
from tests.docs.markdown import ROOT, code_spans, read, table

ADAPTERS = ROOT / "engine_hooks" / "adapters"


@dataclass(frozen=True)
class Engine:
    doc: str
    modules: tuple[str, ...]  # glob patterns under engine_hooks/adapters/ (plugin.py is both engines')
    hooks_off_heading: str
    aside_module: str
    aside_function: str
    aside_columns: tuple[str, str]


VLLM = Engine("docs/vllm.md", ("vllm/*.py", "plugin.py"), "Never silently off", "vllm/v1_sampler_rows.py",
              "step_aside_reason", ("reason", "a row of the batch …"))
SGLANG = Engine("docs/sglang.md", ("sglang/*.py", "plugin.py"), "When SGLang's code is not a release",
                "sglang/sampled_rows.py", "refusal", ("reason", "the batch …"))


def _text(node: ast.expr, constants: dict[str, list[str]]) -> list[str]:
    """The strings an expression can be: a constant, either branch of `a if c else b`, an f-string with `{}` for
    each value, or a module-level tuple's strings (a loop over it)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _text(node.body, constants) + _text(node.orelse, constants)
    if isinstance(node, ast.JoinedStr):
        return ["".join(str(v.value) if isinstance(v, ast.Constant) else "{}" for v in node.values)]
    if isinstance(node, ast.Name):
        return constants.get(node.id, [])
    return []


def _paths(patterns: tuple[str, ...]) -> list[Path]:
    return sorted({path for pattern in patterns for path in ADAPTERS.glob(pattern)})


def hooks_off_reasons(engine: Engine) -> set[str]:
    """Every reason the engine's adapter modules pass to report_hooks_off (3rd argument) or disable (1st)."""
    found: set[str] = set()
    for path in _paths(engine.modules):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                index = {"report_hooks_off": 2, "disable": 0}.get(name)
                if index is not None and len(node.args) > index:
                    found.update(_text(node.args[index], {}))
    return found


def step_aside_reasons(engine: Engine) -> set[str]:
    """The strings the engine's step-aside function returns (loops over a module's (field, reason) tuples
    included)."""
    tree = ast.parse((ADAPTERS / engine.aside_module).read_text(encoding="utf-8"))
    tuples: dict[str, list[str]] = {}
    for statement in tree.body:  # module-level tuples of (field, reason) pairs
        if (isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Tuple)
                and len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name)):
            tuples[statement.targets[0].id] = [
                str(e.elts[1].value) for e in statement.value.elts if isinstance(e, ast.Tuple) and len(e.elts) == 2
                and isinstance(e.elts[1], ast.Constant) and isinstance(e.elts[1].value, str)]
    (function,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == engine.aside_function]
    loops: dict[str, list[str]] = {}  # `for name, what in TUPLE`: `what` is one of the tuple's reasons
    for inner in ast.walk(function):
        if isinstance(inner, ast.For) and isinstance(inner.target, ast.Tuple) and isinstance(inner.iter, ast.Name):
            last = inner.target.elts[-1]
            if isinstance(last, ast.Name):
                loops.setdefault(last.id, []).extend(tuples.get(inner.iter.id, []))
    found: set[str] = set()
    for inner in ast.walk(function):
        if isinstance(inner, ast.Return) and inner.value is not None:
            found.update(_text(inner.value, loops))
    return found


def _placeholders(text: str) -> str:
    return re.sub(r"\{[^}]*\}", "{}", text)


def reason_differences(documented: set[str], code: set[str], what: str) -> list[str]:
    documented, code = {_placeholders(d) for d in documented}, {_placeholders(c) for c in code}
    return ([f"{what} {r!r}: documented, but the adapter never gives it" for r in sorted(documented - code)]
            + [f"{what} {r!r}: the adapter gives it, not documented" for r in sorted(code - documented)])


def documented_reasons(text: str, heading: str, *columns: str) -> set[str]:
    return {span for row in table(text, heading, *columns).rows for span in code_spans(row[columns[0]])[:1]}


def engine_differences(engine: Engine, text: str) -> list[str]:
    return (reason_differences(documented_reasons(text, engine.hooks_off_heading, "reason", "when"),
                               hooks_off_reasons(engine), "hooks-off reason")
            + reason_differences(documented_reasons(text, "", *engine.aside_columns), step_aside_reasons(engine),
                                 "step-aside reason"))


def test_the_adapters_write_only_reasons_the_sidecar_knows():
    for engine in (VLLM, SGLANG):
        assert hooks_off_reasons(engine) <= set(REASONS), engine.doc


def test_vllm_doc_names_the_vllm_adapters_reasons():
    assert engine_differences(VLLM, read(VLLM.doc)) == []


def test_sglang_doc_names_the_sglang_adapters_reasons():
    assert engine_differences(SGLANG, read(SGLANG.doc)) == []


def test_a_planted_reason_is_found():
    vllm = read(VLLM.doc)
    assert engine_differences(VLLM, vllm.replace("| `single_rank` |", "| `model_runner_v2` |")) == [
        "hooks-off reason 'model_runner_v2': documented, but the adapter never gives it",
        "hooks-off reason 'single_rank': the adapter gives it, not documented"]
    sglang = read(SGLANG.doc)
    assert engine_differences(SGLANG, sglang.replace("| `watermarks` |", "| `watermark` |")) == [
        "step-aside reason 'watermark': documented, but the adapter never gives it",
        "step-aside reason 'watermarks': the adapter gives it, not documented"]
