"""What `pip install .` puts into site-packages: one top-level package, `gatherwise`, whose dist-info declares the
engine plugins' entry points and the floors' commands, and whose base requirements (no extra) carry none of the
sidecar's web/metrics/tracing stack, so an engine-side install pulls in no FastAPI, uvicorn or OpenTelemetry."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests._repo import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
# What a checkout holds beyond the source (environments, build outputs, caches): not copied into the build.
NOT_SOURCE = (".git", ".venv*", "build", "dist", "out", "*.egg-info", "__pycache__", ".pytest_cache", ".ruff_cache")
SIDECAR_STACK = ("fastapi", "uvicorn", "starlette", "opentelemetry", "prometheus_client", "httpx")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip install --no-deps --target` of a copy of the checkout (the build writes build/ next to its source)."""
    tmp = tmp_path_factory.mktemp("install")
    source = tmp / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    target = tmp / "site-packages"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
                           "--target", str(target), str(source)], capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return target


def _dist_info(target: Path) -> Path:
    (dist_info,) = target.glob("gatherwise-*.dist-info")
    return dist_info


def test_one_top_level_package(installed: Path) -> None:
    tops = {p.name for p in installed.iterdir()} - {"bin", _dist_info(installed).name}  # bin: the console script
    assert tops == {"gatherwise"}
    floors = {p.name for p in (installed / "gatherwise").iterdir() if (p / "__init__.py").is_file()}
    assert {"shm_format", "engine_hooks", "tp_engine", "dashboards", "sidecar", "bench"} <= floors


def test_every_package_folder_of_the_checkout_is_installed(installed: Path) -> None:
    """setup.py derives the package list from pyproject.toml's package-dir: no room is left out."""
    from tests.core.test_import_boundaries import _package_dirs

    for name, folder in _package_dirs().items():
        for init in (ROOT / folder).rglob("__init__.py"):
            if {"build", "__pycache__"} & set(init.relative_to(ROOT).parts):
                continue
            sub = init.parent.relative_to(ROOT / folder).parts
            assert (installed / Path(*name.split("."), *sub) / "__init__.py").is_file(), (name, sub)


def test_the_engine_plugins_and_the_commands_are_declared_entry_points(installed: Path) -> None:
    text = (_dist_info(installed) / "entry_points.txt").read_text()
    sections = dict(re.findall(r"^\[([^\]]+)\]\n((?:[^\[\n].*\n?)*)", text, flags=re.M))
    assert "gatherwise = gatherwise.engine_hooks.adapters.vllm.plugin:register" in sections["vllm.general_plugins"]
    assert "gatherwise = gatherwise.engine_hooks.adapters.sglang.plugin:register" in sections["sglang.srt.plugins"]
    assert "gatherwise = gatherwise.cli:main" in sections["console_scripts"]
    commands = dict(line.split(" = ") for line in sections["gatherwise.commands"].strip().splitlines())
    assert set(commands) == {"bench", "demo", "doctor", "engine", "generate", "mode", "models", "sidecar"}
    for value in commands.values():  # every command's module is in the installed tree
        module = value.split(":")[0]
        assert (installed / Path(*module.split("."))).with_suffix(".py").is_file(), value


def _distribution_name(requirement: str) -> str:
    """The normalized distribution name a Requires-Dist value starts with."""
    found = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert found, f"a Requires-Dist value without a distribution name: {requirement!r}"
    return re.sub(r"[-_.]+", "_", found.group(0)).lower()


def test_the_base_requirements_carry_no_sidecar_stack(installed: Path) -> None:
    metadata = (_dist_info(installed) / "METADATA").read_text()
    requires = re.findall(r"^Requires-Dist: (.+)$", metadata, flags=re.M)
    base = [r for r in requires if "extra ==" not in r]
    names = {_distribution_name(r) for r in base}
    assert names and not {n for n in names if n.startswith(SIDECAR_STACK)}, base
    sidecar_extra = [r for r in requires if re.search(r"""extra == ["']sidecar["']""", r)]
    assert any(r.startswith("fastapi") for r in sidecar_extra)


def test_the_live_page_assets_are_installed(installed: Path) -> None:
    from gatherwise.sidecar.api.routes_page import ASSETS

    assets = installed / "gatherwise" / "sidecar" / "api" / "page_assets"
    for name in ("index.html", *ASSETS):
        assert (assets / name).is_file(), name


def test_the_demo_finds_its_config_in_an_install(installed: Path) -> None:
    """`gatherwise demo`'s default config ships with the package, not only in a checkout's config/."""
    from gatherwise.dashboards.demo import DEFAULT_CONFIG

    assert (installed / "gatherwise" / "dashboards" / DEFAULT_CONFIG.name).is_file()


def test_the_verified_engine_fingerprints_are_installed(installed: Path) -> None:
    """The plugins' engagement check and `gatherwise doctor` read them next to their code."""
    from gatherwise.engine_hooks.fingerprints.verified import DATA_DIR

    shipped = sorted(p.name for p in (installed / "gatherwise" / "engine_hooks" / "fingerprints" / "data").glob("*"))
    assert shipped == sorted(p.name for p in DATA_DIR.glob("*.json")) and "vllm-0.34.0.json" in shipped
