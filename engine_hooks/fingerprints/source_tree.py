"""Where an engine's Python sources are read from, without importing the engine: an installed tree (a
site-packages directory, or the one holding the live install) or a wheel file."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import zipfile
from email.parser import HeaderParser
from pathlib import Path
from typing import Protocol


def module_files(module: str) -> tuple[str, str]:
    """The two paths a module's source can have, relative to the tree's root: `a/b.py`, `a/b/__init__.py`."""
    base = module.replace(".", "/")
    return f"{base}.py", f"{base}/__init__.py"


class SourceTree(Protocol):
    def source(self, module: str) -> str | None:
        """The module's source text; None when the tree has no such module."""
        ...

    def version(self, package: str) -> str:
        """The version of the distribution that installs `package`."""
        ...


class InstalledTree:
    """A directory that holds installed packages (a site-packages)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def live(cls, package: str) -> InstalledTree | None:
        """The tree this interpreter imports `package` from; None when it is not installed. Locating a top-level
        package runs none of its code."""
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            return None
        return cls(Path(next(iter(spec.submodule_search_locations))).parent)

    def source(self, module: str) -> str | None:
        for relative in module_files(module):
            path = self.root / relative
            if path.is_file():
                return path.read_text(encoding="utf-8")
        return None

    def version(self, package: str) -> str:
        for dist in importlib.metadata.distributions(path=[str(self.root)]):
            tops = (dist.read_text("top_level.txt") or "").split()
            if package in tops or any(f.parts[:2] == (package, "__init__.py") for f in dist.files or ()):
                return dist.version
        raise LookupError(f"no distribution in {self.root} installs {package}")

    def __str__(self) -> str:
        return str(self.root)


class WheelTree:
    """A wheel file, read as the zip it is."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._zip = zipfile.ZipFile(path)
        self._names = set(self._zip.namelist())

    def source(self, module: str) -> str | None:
        for relative in module_files(module):
            if relative in self._names:
                return self._zip.read(relative).decode("utf-8")
        return None

    def version(self, package: str) -> str:
        metadata = [n for n in self._names if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if len(metadata) != 1:
            raise LookupError(f"{self.path} has {len(metadata)} dist-info METADATA files, not one")
        return HeaderParser().parsestr(self._zip.read(metadata[0]).decode("utf-8"))["Version"]

    def __str__(self) -> str:
        return str(self.path)


def open_tree(path: Path) -> SourceTree:
    """A wheel file or an installed tree, by what `path` is."""
    return WheelTree(path) if path.suffix == ".whl" else InstalledTree(path)
