"""Lay out the installed package shape from a checkout without installing: OUT/gatherwise/... as symlinks, and a
dist-info with the project's entry points.

The repository keeps one folder per floor at its top (`sidecar/`, `engine_hooks/`, ...); installed, each is a
subpackage of `gatherwise`, as pyproject.toml's [tool.setuptools.package-dir] declares (read here with tomllib,
as setup.py reads it). The type checker puts OUT on its path; machines that run from a plain checkout (the GPU
check) too, and find the `gatherwise` subcommands the standard way (importlib.metadata reads OUT's dist-info).
"""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    try:
        import tomli as tomllib
    except ModuleNotFoundError:
        sys.exit("package_tree.py reads pyproject.toml with tomllib: Python 3.11+, or `pip install tomli`")

ROOT = Path(__file__).resolve().parent.parent


def pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def package_dirs() -> dict[str, str]:
    """Installed package name -> its folder in the repository."""
    dirs: dict[str, str] = pyproject()["tool"]["setuptools"]["package-dir"]
    return dirs


def lay_out(out: Path) -> Path:
    top = out / "gatherwise"
    top.mkdir(parents=True, exist_ok=True)
    for entry in (ROOT / "gatherwise").iterdir():
        if entry.name != "__pycache__":
            _link(top / entry.name, entry)
    for name, folder in package_dirs().items():
        if name != "gatherwise":
            _link(top / name.removeprefix("gatherwise."), ROOT / folder)
    _write_dist_info(out)
    return out


def _write_dist_info(out: Path) -> None:
    """The metadata a `pip install` would write that code reads at run time: name, version, entry points."""
    project = pyproject()["project"]
    for old in out.glob("gatherwise-*.dist-info"):
        for file in old.iterdir():
            file.unlink()
        old.rmdir()
    info = out / f"gatherwise-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: gatherwise\nVersion: {project['version']}\n")
    groups = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in points.items()) + "\n"
        for group, points in groups.items()))


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
