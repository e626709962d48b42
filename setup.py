"""The package list, derived from the one declaration of the layout: pyproject.toml's
[tool.setuptools.package-dir] (installed package -> its folder in the repository). Every folder with an
`__init__.py` below a mapped folder installs as the matching subpackage, so a new room needs no list kept by hand.
Everything else about the build is in pyproject.toml.
"""

import sys

from setuptools import find_packages, setup

if sys.version_info >= (3, 11):
    import tomllib
else:  # build-system.requires installs it on 3.10
    import tomli as tomllib

with open("pyproject.toml", "rb") as f:
    PACKAGE_DIR = tomllib.load(f)["tool"]["setuptools"]["package-dir"]

# a mapped folder's own subpackages, unless mapped themselves (gatherwise/ holds none of the other floors)
packages = sorted({f"{name}.{sub}" for name, folder in PACKAGE_DIR.items() for sub in find_packages(folder)}
                  | set(PACKAGE_DIR))
setup(packages=packages)
