"""Engine fingerprints on real files: what changes a fingerprint and what does not, reading an installed tree and a
wheel without importing anything, the engagement rule, and that the shipped data covers every point the runners
rely on. The engines' own installs and release wheels are checked in tests/vllm/ and tests/sglang/."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gatherwise.engine_hooks.fingerprints.check import ABSENT_VERDICT, DIFFERS, MATCH, engagement
from gatherwise.engine_hooks.fingerprints.engines import ENGINES
from gatherwise.engine_hooks.fingerprints.fingerprint import ABSENT, WHOLE_MODULE, Fingerprint, fingerprints
from gatherwise.engine_hooks.fingerprints.point import Point, RunnerPoints
from gatherwise.engine_hooks.fingerprints.source_tree import InstalledTree, WheelTree
from gatherwise.engine_hooks.fingerprints.verified import Release, verified_releases
from tests._repo import ROOT

SAMPLER = '''
import torch


class Sampler:
    """The sampler."""

    def forward(self, logits, meta=None):
        """Draw."""
        x = logits.argmax(-1)  # greedy
        return x

if torch.cuda.is_available():
    def fused(x):
        return x
'''
FORWARD = Point("eng.sampler", "Sampler.forward")
CLASS = Point("eng.sampler", "Sampler")
FUSED = Point("eng.sampler", "fused")
MISSING = Point("eng.sampler", "Sampler.backward")
MODULE = Point("eng.sampler", WHOLE_MODULE)
POINTS = (FORWARD, CLASS, FUSED, MISSING, MODULE)


def _site(tmp_path: Path, sampler: str, version: str = "1.0") -> InstalledTree:
    site = tmp_path / f"site-{version}"
    (site / "eng").mkdir(parents=True)
    (site / "eng" / "__init__.py").write_text("")
    (site / "eng" / "sampler.py").write_text(sampler)
    dist = site / f"eng-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: eng\nVersion: {version}\n")
    (dist / "top_level.txt").write_text("eng\n")
    return InstalledTree(site)


def test_formatting_comments_and_docstrings_keep_a_fingerprint_and_any_code_change_moves_it(tmp_path):
    base = fingerprints(_site(tmp_path, SAMPLER), POINTS)
    assert base[FORWARD].present and base[FORWARD].signature == "(self, logits, meta=None)"
    assert base[CLASS].signature == "class()" and base[FUSED].present  # a definition under a module-level if
    assert base[MISSING] == ABSENT and base[MODULE].present
    reformatted = SAMPLER.replace('"""Draw."""', '"""Draw a token\n        (greedy)."""').replace("  # greedy", "") \
        .replace("argmax(-1)", "argmax( -1 )").replace("    def forward(self, logits, meta=None):",
                                                       "    def forward(self,\n                logits, meta=None):")
    assert fingerprints(_site(tmp_path, reformatted, "1.1"), POINTS)[FORWARD] == base[FORWARD]
    changed = fingerprints(_site(tmp_path, SAMPLER.replace("argmax(-1)", "argmax(1)"), "1.2"), POINTS)
    assert changed[FORWARD].hash != base[FORWARD].hash and changed[FORWARD].signature == base[FORWARD].signature
    assert changed[CLASS].hash != base[CLASS].hash  # a class's fingerprint covers its methods
    assert changed[FUSED] == base[FUSED]
    default = fingerprints(_site(tmp_path, SAMPLER.replace("meta=None", "meta=0"), "1.3"), POINTS)
    assert default[FORWARD].signature == "(self, logits, meta=0)"


def test_a_wheel_reads_as_the_installed_tree_it_would_become(tmp_path):
    tree = _site(tmp_path, SAMPLER)
    wheel = tmp_path / "eng-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path in tree.root.rglob("*"):
            if path.is_file():
                z.write(path, path.relative_to(tree.root).as_posix())
    assert WheelTree(wheel).version("eng") == tree.version("eng") == "1.0"
    assert fingerprints(WheelTree(wheel), POINTS) == fingerprints(tree, POINTS)
    assert WheelTree(wheel).source("eng.nothing") is None


def _release(version: str, points: dict[Point, Fingerprint]) -> Release:
    return Release("eng", version, points)


def test_a_runner_engages_only_when_one_release_agrees_at_every_point():
    a, b, c = (Fingerprint(True, "()", h) for h in "abc")
    step, sample, new = Point("m", "step"), Point("m", "sample"), Point("m", "new")
    runner = RunnerPoints("r", "the runner", own=(sample,), shared=(step,), optional=(new,))
    releases = [_release("1", {step: a, sample: a, new: ABSENT}), _release("2", {step: a, sample: b, new: c})]

    assert engagement(runner, {step: a, sample: b, new: c}, releases).release == "eng 2"
    assert engagement(runner, {step: a, sample: a}, releases).release == "eng 1"  # optional: absent in both
    patchwork = engagement(runner, {step: a, sample: b, new: ABSENT}, releases)
    assert not patchwork.engage and "m:sample matches only eng 2" in patchwork.reason
    differs = engagement(runner, {step: c, sample: a}, releases)
    assert not differs.engage and differs.reason == "the runner: m:step: differs from every verified release " \
                                                    "(signature ())"
    assert [v.verdict for v in differs.verdicts] == [DIFFERS, MATCH, ABSENT_VERDICT]
    gone = engagement(runner, {sample: a}, [*releases, _release("3", {sample: a})])
    assert not gone.engage and "m:step: absent" in gone.reason  # a required point must exist
    unhooked = RunnerPoints("u", "another runner", own=(step,), hooked=False)
    assert not engagement(unhooked, {step: a}, releases).engage


def test_the_shipped_data_covers_every_point_of_every_runner():
    """Regenerate (python -m gatherwise.engine_hooks.fingerprints.generate) when a point list changes."""
    for name, engine in ENGINES.items():
        releases = verified_releases(name)
        assert releases, name
        for release in releases:
            assert set(release.points) == set(engine.points), (release.label, set(engine.points) ^ set(release.points))


def test_the_vllm_points_name_the_kernel_the_v2_sharded_sampler_launches():
    """vllm_points names it without importing the torch module that launches it."""
    from gatherwise.engine_hooks.adapters.vllm.v2_keyed import KERNEL
    from gatherwise.engine_hooks.fingerprints.vllm_points import V2

    assert Point(*KERNEL) in V2.own


def test_the_generator_writes_what_it_read(tmp_path):
    """The command on an installed tree holding one of SGLang's modules: every point recorded, the others absent."""
    site = tmp_path / "site"
    (site / "sglang" / "srt" / "layers").mkdir(parents=True)
    for init in ("sglang", "sglang/srt", "sglang/srt/layers"):
        (site / init / "__init__.py").write_text("")
    (site / "sglang" / "srt" / "layers" / "sampler.py").write_text(
        "class Sampler:\n    def forward(self, logits_output, sampling_info):\n        return None\n")
    dist = site / "sglang-9.9.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 9.9\n")
    (dist / "top_level.txt").write_text("sglang\n")
    proc = subprocess.run([sys.executable, "-m", "gatherwise.engine_hooks.fingerprints.generate", "sglang", str(site),
                           "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    (release,) = verified_releases("sglang", tmp_path)
    assert release.version == "9.9" and set(release.points) == set(ENGINES["sglang"].points)
    present = {p.name: fp.signature for p, fp in release.points.items() if fp.present}
    assert present == {"sglang.srt.layers.sampler:Sampler.forward": "(self, logits_output, sampling_info)"}


@pytest.mark.skipif(any(importlib.util.find_spec(e) for e in ENGINES), reason="an engine is installed here")
@pytest.mark.timeout(120)
def test_doctor_without_the_web_stack_or_an_engine_says_so_and_exits_1(tmp_path):
    """This environment has neither vLLM nor SGLang; fastapi is made unimportable, as in an engine-side install."""
    code = "import sys; sys.modules['fastapi'] = None; from gatherwise.cli import main; sys.exit(main(['doctor']))"
    env = {"PATH": "/usr/bin:/bin", "GATHERWISE_ENGINE_SHM_DIR": str(tmp_path / "shm")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100, cwd=ROOT,
                          env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "none of vLLM, SGLang is installed" in proc.stdout
    assert f"engine.shm_dir {tmp_path / 'shm'}: does not exist yet (created under {tmp_path}" in proc.stdout
    assert "GiB free" in proc.stdout
