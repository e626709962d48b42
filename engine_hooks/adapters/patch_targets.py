"""What an adapter checks before it wraps anything in an engine, after its fingerprints engaged: targets of the
shape it was written against. Engine-neutral; each adapter lists its own targets (vllm/patches.py, sglang/patches.py).

A check that fails leaves the engine untouched, and the adapter says why in ONE warning: patching an engine
whose internals moved would risk wrong tokens, which is worse than running without gatherwise.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Target:
    """One engine function an adapter wraps: `module.cls.attr`, whose leading parameters must be `params`."""

    module: str
    cls: str
    attr: str
    params: tuple[str, ...]  # leading parameter names the wrapper relies on

    @property
    def name(self) -> str:
        return f"{self.module}.{self.cls}.{self.attr}"

    def owner(self) -> Any:
        return getattr(importlib.import_module(self.module), self.cls)


def compatibility_problems(engine: str, targets: Iterable[Target], used_names: Iterable[tuple[str, str]]) -> list[str]:
    """Empty when an adapter may patch `targets` of the installed `engine`; else the reasons it must not. Runs
    after the fingerprint check engaged (gatherwise.engine_hooks.adapters.engagement): a second guard on what the
    wrappers themselves rely on, at import."""
    try:
        classes, problems = import_problems(targets, used_names)
    except Exception as exc:  # an engine module failing at import time for its own reasons
        return [f"{engine} is not importable ({exc!r})"]
    return problems + target_problems(classes)


def target_problems(classes: Mapping[Target, Any]) -> list[str]:
    """What differs from the expected shape, for {target: the class that should own it}."""
    problems = []
    for target, owner in classes.items():
        fn = getattr(owner, target.attr, None)
        if not callable(fn):
            problems.append(f"{target.name} is missing")
            continue
        try:
            params = tuple(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            problems.append(f"{target.name} has no readable signature")
            continue
        if params[: len(target.params)] != target.params:
            problems.append(f"{target.name}{params} does not start with {target.params}")
    return problems


def import_problems(targets: Iterable[Target], used_names: Iterable[tuple[str, str]]) -> tuple[dict, list[str]]:
    """Import every target's class and every (module, name) the hooks use at run time.

    Returns ({target: class} for the importable targets, [problems]); a missing name refuses up front rather
    than failing inside an engine step.
    """
    classes, problems = {}, []
    for target in targets:
        try:
            classes[target] = target.owner()
        except (ImportError, AttributeError) as exc:
            problems.append(f"{target.module}.{target.cls} is not importable ({exc})")
    for module, name in used_names:
        try:
            getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            problems.append(f"{module}.{name} is not importable ({exc})")
    return classes, problems
