"""Each engine plugin (vLLM, SGLang) refuses an engine whose code it was not verified against: hooks off, the
engine untouched, one clear warning naming what differs; and does nothing at all unless enabled.

Runs without either engine: a few of the engine's modules are written as a tiny installed tree and checked against
fingerprints generated from it (the real engines and releases: tests/vllm/, tests/sglang/), and the class shapes
are faked, never the engine itself.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from gatherwise.engine_hooks.adapters import engagement, hooks_off
from gatherwise.engine_hooks.adapters.patch_targets import Target, target_problems
from gatherwise.engine_hooks.adapters.sglang import patches as sglang_patches
from gatherwise.engine_hooks.adapters.sglang import plugin as sglang_plugin
from gatherwise.engine_hooks.adapters.vllm import patches as vllm_patches
from gatherwise.engine_hooks.adapters.vllm import plugin as vllm_plugin
from gatherwise.engine_hooks.fingerprints.engines import ENGINES as FINGERPRINTED
from gatherwise.engine_hooks.fingerprints.engines import InstallCheck, check_install
from gatherwise.engine_hooks.fingerprints.point import Point
from gatherwise.engine_hooks.fingerprints.source_tree import InstalledTree
from gatherwise.engine_hooks.fingerprints.verified import write_release
from gatherwise.shm_format.hooks_off import read_notices


@dataclass(frozen=True)
class Engine:
    name: str  # as the warnings spell it
    package: str  # its top-level module
    plugin: ModuleType
    patches: ModuleType
    unknown_version: str
    runner_module: str  # a module of one of its hooked runners, and a function of it the runner relies on
    runner_class: str
    runner_method: str
    undo: Callable[[], None]  # forget whatever a failing test may have applied

    @property
    def logger(self) -> str:
        return f"gatherwise.{self.package}"


VLLM = Engine("vLLM", "vllm", vllm_plugin, vllm_patches, "0.99.1", "vllm.v1.worker.gpu.model_runner",
              "GPUModelRunner", "sample", vllm_patches.remove)
SGLANG = Engine("SGLang", "sglang", sglang_plugin, sglang_patches, "0.5.24", "sglang.srt.model_executor.model_runner",
                "ModelRunner", "sample", sglang_patches._registered.clear)
ENGINES = pytest.mark.parametrize("engine", [VLLM, SGLANG], ids=lambda e: e.package)


@pytest.fixture
def enabled(monkeypatch, tmp_path):
    monkeypatch.setenv("GATHERWISE_ENABLE", "1")
    monkeypatch.setenv("GATHERWISE_ENGINE_SHM_DIR", str(tmp_path / "shm"))
    monkeypatch.setattr(hooks_off, "_said", set())  # each test is a fresh engine process
    return tmp_path / "shm"


def _fresh(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine.plugin.PLUGIN, "registered", False)


def _no_apply(hooks):
    raise AssertionError("the engine must not be patched")


def _tree(root: Path, engine: Engine, body: str) -> InstalledTree:
    """`root` as a site directory holding stand-ins for every point of the hooked runner of `engine` that relies
    on its runner method, that method running `body`."""
    classes: dict[str, dict[str, list[str]]] = {}  # module -> class (or "" for module level) -> members
    method = Point(engine.runner_module, f"{engine.runner_class}.{engine.runner_method}")
    runner = next(r for r in FINGERPRINTED[engine.package].runners if r.hooked and method in r.required)
    for point in runner.required:
        owner, _, member = point.qualname.rpartition(".")
        classes.setdefault(point.module, {}).setdefault(owner, []).append(member)
    for module, owners in classes.items():
        lines = [f"def {name}(self, batch):\n    return batch\n" for name in owners.pop("", [])]
        for cls, members in owners.items():
            methods = [f"    def {m}(self, batch):\n        "
                       f"{body if (cls, m) == (engine.runner_class, engine.runner_method) else 'return batch'}\n"
                       for m in members]
            lines.append(f"class {cls}:\n" + "".join(methods))
        path = root / (module.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines))
    dist = root / f"{engine.package}-{engine.unknown_version}.dist-info"
    dist.mkdir(exist_ok=True)
    version = engine.unknown_version
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {engine.package}\nVersion: {version}\n")
    (dist / "top_level.txt").write_text(f"{engine.package}\n")
    return InstalledTree(root)


def _checks(engine: Engine, tmp_path: Path) -> tuple[InstallCheck, InstallCheck]:
    """(the tree as verified, the same tree with its runner method altered), both against fingerprints generated
    from the first: the decision is the code's, whatever the version string says."""
    data = tmp_path / "verified"
    data.mkdir()
    fingerprinted = FINGERPRINTED[engine.package]
    verified = _tree(tmp_path / "verified-site", engine, "return batch")
    write_release(fingerprinted.release(verified), data)
    checks = [check_install(fingerprinted, tree, data) for tree in (
        verified, _tree(tmp_path / "altered-site", engine, "return None"))]
    assert checks[0] is not None and checks[1] is not None
    return checks[0], checks[1]


@ENGINES
def test_the_engagement_decision_is_the_code_not_the_version(engine, tmp_path):
    verified, altered = _checks(engine, tmp_path)
    assert engagement.install_refusal(verified, engine.name) is None
    refusal = engagement.install_refusal(altered, engine.name)
    assert refusal is not None and f"{engine.runner_module}:{engine.runner_class}.{engine.runner_method}: differs" \
        in refusal
    assert engagement.install_refusal(None, engine.name) == f"{engine.name} is not installed"


@ENGINES
def test_an_unverified_engine_is_left_untouched_with_one_warning(engine, enabled, monkeypatch, caplog, tmp_path):
    _fresh(engine, monkeypatch)
    _, altered = _checks(engine, tmp_path)
    monkeypatch.setattr(engagement, "check_engine", lambda name: altered)
    monkeypatch.setattr(engine.patches, "apply", _no_apply)
    had_engine = engine.package in sys.modules
    try:
        with caplog.at_level(logging.WARNING, logger=engine.logger):
            engine.plugin.register()
            engine.plugin.register()  # engines call a plugin in every process, and may do so more than once
    finally:
        engine.undo()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    text = warnings[0].getMessage()
    differs = f"{engine.runner_module}:{engine.runner_class}.{engine.runner_method}: differs from every verified"
    assert f"{engine.name} {engine.unknown_version} matches no verified release" in text and differs in text
    assert f"leaves {engine.name} untouched" in text
    assert not engine.patches.applied()
    assert (engine.package in sys.modules) == had_engine  # the check read sources: no engine module was imported
    # the sidecar learns it too: one notice, held by this (live) process
    (notice,) = read_notices(enabled)
    assert (notice.engine, notice.reason, notice.pid) == (engine.name, "unsupported_version", os.getpid())
    assert differs in notice.detail


@ENGINES
def test_missing_engine_is_one_warning(engine, enabled, monkeypatch, caplog):
    _fresh(engine, monkeypatch)
    monkeypatch.setattr(engagement, "check_engine", lambda name: None)
    with caplog.at_level(logging.WARNING, logger=engine.logger):
        engine.plugin.register()
    assert len(caplog.records) == 1 and f"{engine.name} is not installed" in caplog.records[0].getMessage()


@ENGINES
def test_disabled_plugin_does_nothing(engine, monkeypatch, caplog):
    _fresh(engine, monkeypatch)
    monkeypatch.delenv("GATHERWISE_ENABLE", raising=False)
    monkeypatch.setattr(engagement, "check_engine", lambda name: pytest.fail("must not look at the engine"))
    with caplog.at_level(logging.DEBUG, logger=engine.logger):
        engine.plugin.register()
    assert not caplog.records and not engine.patches.applied()


@ENGINES
def test_shape_problem_also_refuses(engine, enabled, monkeypatch, caplog, tmp_path):
    _fresh(engine, monkeypatch)
    verified, _ = _checks(engine, tmp_path)
    monkeypatch.setattr(engagement, "check_engine", lambda name: verified)
    monkeypatch.setattr(engine.patches, "compatibility_problems", lambda check: ["engine.Sampler.forward is missing"])
    monkeypatch.setattr(engine.patches, "apply", _no_apply)
    with caplog.at_level(logging.WARNING, logger=engine.logger):
        engine.plugin.register()
    assert len(caplog.records) == 1 and "Sampler.forward is missing" in caplog.records[0].getMessage()


# -- the shape check: classes shaped like the engine's, then one renamed parameter, then one missing method ----
class _VllmProcessor:
    def _gather_logits(self, logits):
        return logits


class _VllmRunner:
    def execute_model(self, scheduler_output, intermediate_tensors=None):
        return None


class _VllmSampler:
    def forward(self, logits, sampling_metadata):
        return logits


class _VllmRenamedSampler:
    def forward(self, logits, metadata):  # a vLLM where the parameter was renamed
        return logits


class _SglangSampler:
    def forward(self, logits_output, sampling_info, return_logprob, top_logprobs_nums, token_ids_logprobs,
                positions, *, logprob_logits=None):
        return None

    def _sync_token_ids_across_tp(self, batch_next_token_ids, sampling_info):
        return None


class _SglangRenamedSampler(_SglangSampler):
    def forward(  # type: ignore[override]  # the incompatible signature is what this stand-in is for
            self, logits, sampling_info, return_logprob, top_logprobs_nums, token_ids_logprobs, positions):
        return None  # an SGLang where the first parameter was renamed


@dataclass(frozen=True)
class ShapeCase:
    classes: dict[Target, type]  # every target's class, shaped as the adapter expects
    renamed: tuple[Target, type, str]  # (target, a class where it has another parameter, the parameter named)
    missing: tuple[Target, str]  # (target whose class loses it, what the problem says)


SHAPES = [
    ShapeCase({vllm_patches.GATHER_LOGITS: _VllmProcessor, vllm_patches.EXECUTE_MODEL: _VllmRunner,
               vllm_patches.SAMPLER_FORWARD: _VllmSampler},
              (vllm_patches.SAMPLER_FORWARD, _VllmRenamedSampler, "sampling_metadata"),
              (vllm_patches.EXECUTE_MODEL, "GPUModelRunner.execute_model is missing")),
    ShapeCase({sglang_patches.SAMPLER_FORWARD: _SglangSampler, sglang_patches.SYNC_TOKEN_IDS: _SglangSampler},
              (sglang_patches.SAMPLER_FORWARD, _SglangRenamedSampler, "logits_output"),
              (sglang_patches.SYNC_TOKEN_IDS, "_sync_token_ids_across_tp is missing")),
]


@pytest.mark.parametrize("case", SHAPES, ids=("vllm", "sglang"))
def test_shape_check_names_what_changed(case):
    classes = dict(case.classes)
    assert target_problems(classes) == []
    target, renamed, param = case.renamed
    classes[target] = renamed
    problems = target_problems(classes)
    assert len(problems) == 1 and f"{target.cls}.{target.attr}" in problems[0] and param in problems[0]
    gone, text = case.missing
    classes[gone] = object
    assert any(text in p for p in target_problems(classes))
