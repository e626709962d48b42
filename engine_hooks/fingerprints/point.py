"""An engine point (a module and a qualified name in it) and the sets of points each engine runner relies on."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Point:
    """`module:qualname`, e.g. `vllm.v1.sample.sampler:Sampler.forward`; a qualname names a function, a class, a
    method or a module-level assignment."""

    module: str
    qualname: str

    @property
    def name(self) -> str:
        return f"{self.module}:{self.qualname}"

    @classmethod
    def parse(cls, name: str) -> Point:
        module, sep, qualname = name.partition(":")
        if not (sep and module and qualname):
            raise ValueError(f"{name!r} is not module:qualname")
        return cls(module, qualname)


@dataclass(frozen=True)
class RunnerPoints:
    """What one engine runner needs to match a verified release before the hooks engage on it.

    `own`: the runner's own points that must exist (what the hooks patch, read, or call through; an install
    without any of them does not have the runner); `shared`: those it needs that other runners need too (the
    logits processor); `optional`: points on the path in some releases only (they must agree with the same
    release: present there and alike, or absent in both). `hooked`: False for a runner gatherwise knows of but
    does not hook, where the hooks step aside.
    """

    runner: str
    description: str
    own: tuple[Point, ...]
    shared: tuple[Point, ...] = ()
    optional: tuple[Point, ...] = ()
    hooked: bool = True

    @property
    def required(self) -> tuple[Point, ...]:
        return self.shared + self.own

    @property
    def points(self) -> tuple[Point, ...]:
        return self.required + self.optional
