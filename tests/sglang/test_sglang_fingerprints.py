"""SGLang's fingerprints against the installed SGLang 0.5.23: they equal the stored ones, and `gatherwise doctor`
exits 0 here and 1 naming the point on a copy of SGLang's sources with one function altered."""

from __future__ import annotations

import os

import pytest

from gatherwise.engine_hooks.fingerprints.engines import ENGINES
from gatherwise.engine_hooks.fingerprints.point import Point
from gatherwise.engine_hooks.fingerprints.source_tree import InstalledTree
from gatherwise.engine_hooks.fingerprints.verified import verified_releases
from tests._source_copies import alter, copy_sources, run_doctor

SGLANG = ENGINES["sglang"]
ALTERED = Point("sglang.srt.layers.sampler", "Sampler.forward")



def test_the_installed_sglang_gives_the_stored_fingerprints():
    tree = InstalledTree.live("sglang")
    assert tree is not None
    (release,) = [r for r in verified_releases("sglang") if r.version == "0.5.23"]
    assert SGLANG.release(tree) == release


@pytest.mark.timeout(300)
def test_doctor_exits_0_here_and_1_naming_the_point_on_an_altered_copy(tmp_path):
    env = {**os.environ, "GATHERWISE_ENGINE_SHM_DIR": str(tmp_path / "shm")}
    proc = run_doctor(env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SGLang 0.5.23" in proc.stdout and "hooks engage (every point matches sglang 0.5.23)" in proc.stdout
    assert "SGLang shared-memory all_gather: " in proc.stdout

    tree = InstalledTree.live("sglang")
    assert tree is not None
    site = copy_sources(tree, "sglang", SGLANG.points, tmp_path / "site")
    alter(site, ALTERED)
    proc = run_doctor({**env, "PYTHONPATH": os.pathsep.join([str(site), env.get("PYTHONPATH", "")])})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    problems = proc.stdout.split("the hooks would NOT engage", 1)[1]
    assert f"{ALTERED.name}: differs from every verified release" in problems, problems
