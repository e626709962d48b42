"""Import-only stand-in for SGLang's `sgl_kernel` (gatherwise test environment only; see docs/sglang.md).

SGLang 0.5.23 imports `sgl_kernel` and some of its submodules on the CPU path without calling them. Here every
attribute of the package and of any `sgl_kernel.<submodule>` (and every attribute of those) is a stand-in that
raises when called, so an import succeeds and any real use fails loudly instead of computing something wrong.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable

STAND_IN = True


class StandInCalled(RuntimeError):
    """A kernel of the stand-in was called: this code path needs the real sgl_kernel."""


_made: dict[str, type] = {}


class _StandInMeta(type):
    """Every name of the stand-in is a class of this metaclass: usable where SGLang only names it at import time
    (annotations, isinstance, attribute chains such as `scalar_types.uint4b8`), raising when called."""

    def __call__(cls, *args, **kwargs):
        raise StandInCalled(f"{cls.__qualname__} was called, but sgl_kernel here is gatherwise's import-only "
                            "test stand-in")

    def __getattr__(cls, name: str) -> type:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stand_in(f"{cls.__qualname__}.{name}")


def _stand_in(qualname: str) -> type:
    if qualname not in _made:  # one object per name, so `is` and dict keys behave
        _made[qualname] = _StandInMeta(qualname.rsplit(".", 1)[-1], (),
                                       {"__qualname__": qualname, "__module__": __name__})
    return _made[qualname]


def _module_getattr(module_name: str) -> Callable[[str], type]:
    def __getattr__(name: str) -> type:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # keep Python's own protocol lookups (e.g. __path__, __file__) honest
        return _stand_in(f"{module_name}.{name}")

    return __getattr__


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes every `sgl_kernel.<name>` importable as a module of raising callables."""

    def find_spec(self, fullname, path, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _module_getattr(spec.name)  # type: ignore[method-assign]  # a module __getattr__ (PEP 562)
        return module

    def exec_module(self, module):
        return None


if not any(isinstance(f, _SubmoduleFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _SubmoduleFinder())

__getattr__ = _module_getattr(__name__)
