"""Lay out the installed package shape from a checkout without installing: OUT/gatherwise/... as symlinks.

The repository keeps one folder per floor at its top (`sidecar/`, `engine_hooks/`, ...); installed, each is a
subpackage of `gatherwise` (pyproject.toml's [tool.setuptools.package-dir], read here so the mapping is defined
once). Machines that run from a plain checkout (the GPU check) and the type checker put OUT on their path.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def package_dirs() -> dict[str, str]:
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[tool.setuptools.package-dir]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^"([\w.]+)"\s*=\s*"([\w/.-]+)"', section, flags=re.M))


def lay_out(out: Path) -> Path:
    top = out / "gatherwise"
    top.mkdir(parents=True, exist_ok=True)
    links = {"": ROOT / "gatherwise"}
    links.update({name.removeprefix("gatherwise."): ROOT / folder for name, folder in package_dirs().items()
                  if name != "gatherwise"})
    for entry in (ROOT / "gatherwise").iterdir():
        if entry.name != "__pycache__":
            _link(top / entry.name, entry)
    for sub, folder in links.items():
        if sub:
            _link(top / sub, folder)
    return out


def _link(at: Path, target: Path) -> None:
    if at.is_symlink() and at.resolve() == target.resolve():
        return
    if at.is_symlink():
        at.unlink()
    at.symlink_to(target)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: package_tree.py OUT")
    print(lay_out(Path(sys.argv[1])))
