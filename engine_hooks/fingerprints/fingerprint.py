"""The fingerprint of one engine point, computed from its source (the argument for source over bytecode is in
this package's docstring)."""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from gatherwise.engine_hooks.fingerprints.point import Point
from gatherwise.engine_hooks.fingerprints.source_tree import SourceTree

Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Assign | ast.AnnAssign | ast.ImportFrom


@dataclass(frozen=True)
class Fingerprint:
    present: bool
    signature: str = ""
    hash: str = ""

    def to_json(self) -> dict[str, object]:
        return {"present": self.present, "signature": self.signature, "hash": self.hash}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Fingerprint:
        return cls(bool(data["present"]), str(data["signature"]), str(data["hash"]))


ABSENT = Fingerprint(False)
WHOLE_MODULE = "*"  # the qualname of a point that is a whole module (one whose names gatherwise does not know yet)
UNPARSABLE = "unparsable"  # the hash of a point whose module this Python cannot parse: it matches nothing


def fingerprints(tree: SourceTree, points: Iterable[Point]) -> dict[Point, Fingerprint]:
    """Every point's fingerprint in `tree`, each module read and parsed once."""
    modules: dict[str, ast.Module | str | None] = {}
    out = {}
    for point in points:
        if point.module not in modules:
            modules[point.module] = _parse(tree.source(point.module))
        module = modules[point.module]
        if module is None:
            out[point] = ABSENT
        elif isinstance(module, str):
            out[point] = Fingerprint(True, module, UNPARSABLE)
        elif point.qualname == WHOLE_MODULE:
            out[point] = Fingerprint(True, "module", digest(module))
        else:
            node = find_definition(module, point.qualname)
            out[point] = ABSENT if node is None else Fingerprint(True, signature(node), digest(node))
    return out


def _parse(text: str | None) -> ast.Module | str | None:
    if text is None:
        return None
    try:
        return ast.parse(text)
    except SyntaxError as exc:
        return f"not parsable by this Python ({exc.msg})"


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """A body's statements, including those under module- or class-level if/try/with (conditional definitions),
    never those inside a function."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If | ast.Try | ast.With):
            for block in ("body", "orelse", "handlers", "finalbody"):
                for inner in getattr(stmt, block, []):
                    yield from _statements(inner.body if isinstance(inner, ast.ExceptHandler) else [inner])


def _defines(stmt: ast.stmt, name: str) -> bool:
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return stmt.name == name
    if isinstance(stmt, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets)
    if isinstance(stmt, ast.AnnAssign):
        return isinstance(stmt.target, ast.Name) and stmt.target.id == name
    if isinstance(stmt, ast.ImportFrom):
        return any((alias.asname or alias.name) == name for alias in stmt.names)
    return False


def find_definition(module: ast.Module, qualname: str) -> Definition | None:
    """The statement that defines `qualname` (the last one, as Python keeps the last binding)."""
    body: list[ast.stmt] = module.body
    node: ast.stmt | None = None
    for part in qualname.split("."):
        found = [stmt for stmt in _statements(body) if _defines(stmt, part)]
        if not found:
            return None
        node = found[-1]
        body = node.body if isinstance(node, ast.ClassDef) else []
    assert isinstance(node, Definition)
    return node


def signature(node: Definition) -> str:
    """What a caller or subclass relies on, as text: parameters and return annotation, a class's bases."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
        return f"({ast.unparse(node.args)}){returns}"
    if isinstance(node, ast.ClassDef):
        return f"class({', '.join(ast.unparse(b) for b in [*node.bases, *node.keywords])})"
    if isinstance(node, ast.AnnAssign):
        return f": {ast.unparse(node.annotation)}"
    if isinstance(node, ast.ImportFrom):
        return ast.unparse(node)
    return "="


def digest(node: ast.AST) -> str:
    """A hash of the definition that formatting, comments and docstrings do not change, and any code change does;
    the same on every Python that parses it (empty fields are left out, as newer Pythons add some)."""
    return hashlib.sha256(_canonical(node).encode()).hexdigest()[:32]


def _canonical(value: object) -> str:
    if isinstance(value, ast.AST):
        fields = []
        for name, raw in ast.iter_fields(value):
            field = _without_docstring(value, name, raw) if name == "body" and isinstance(raw, list) else raw
            if field is None or field == [] or name == "type_comment":
                continue
            fields.append(f"{name}={_canonical(field)}")
        return f"{type(value).__name__}({','.join(fields)})"
    if isinstance(value, list):
        return f"[{','.join(_canonical(v) for v in value)}]"
    return repr(value)


def _without_docstring(owner: ast.AST, field: str, body: list[ast.stmt]) -> list[ast.stmt]:
    documented = isinstance(owner, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Module)
    first = body[0] if body else None
    if documented and isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
            and isinstance(first.value.value, str):
        return body[1:] or [ast.Pass()]
    return body
