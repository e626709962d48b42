"""Each engine plugin (vLLM, SGLang) refuses an engine it does not know: hooks off, the engine untouched, one
clear warning; and does nothing at all unless enabled.

Runs without either engine: the version lookup and the class shapes are faked, never the engine itself.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import pytest

from gatherwise.engine_hooks.adapters import hooks_off
from gatherwise.engine_hooks.adapters.patch_targets import Target, target_problems, version_supported
from gatherwise.engine_hooks.adapters.sglang import patches as sglang_patches
from gatherwise.engine_hooks.adapters.sglang import plugin as sglang_plugin
from gatherwise.engine_hooks.adapters.vllm import patches as vllm_patches
from gatherwise.engine_hooks.adapters.vllm import plugin as vllm_plugin
from gatherwise.shm_format.hooks_off import read_notices


@dataclass(frozen=True)
class Engine:
    name: str  # as the warnings spell it
    package: str  # its top-level module
    plugin: ModuleType
    patches: ModuleType
    unknown_version: str
    supported_text: str  # how the warning names the supported releases
    undo: Callable[[], None]  # forget whatever a failing test may have applied

    @property
    def logger(self) -> str:
        return f"gatherwise.{self.package}"


VLLM = Engine("vLLM", "vllm", vllm_plugin, vllm_patches, "0.99.1", "0.32.x", vllm_patches.remove)
SGLANG = Engine("SGLang", "sglang", sglang_plugin, sglang_patches, "0.5.24", "0.5.23",
                sglang_patches._registered.clear)
ENGINES = pytest.mark.parametrize("engine", [VLLM, SGLANG], ids=lambda e: e.package)


@pytest.fixture
def enabled(monkeypatch, tmp_path):
    monkeypatch.setenv("GATHERWISE_ENABLE", "1")
    monkeypatch.setenv("GATHERWISE_ENGINE_SHM_DIR", str(tmp_path / "shm"))
    monkeypatch.setattr(hooks_off, "_said", set())  # each test is a fresh engine process
    return tmp_path / "shm"


def _fresh(engine: Engine, monkeypatch) -> None:
    monkeypatch.setattr(engine.plugin.PLUGIN, "registered", False)


def _no_apply(hooks):
    raise AssertionError("the engine must not be patched")


@ENGINES
def test_unknown_version_leaves_the_engine_untouched_with_one_warning(engine, enabled, monkeypatch, caplog):
    _fresh(engine, monkeypatch)
    monkeypatch.setattr(engine.patches, "installed_version", lambda: engine.unknown_version)
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
    assert f"{engine.name} {engine.unknown_version} is not a version this adapter knows" in text
    assert engine.supported_text in text and f"leaves {engine.name} untouched" in text
    assert not engine.patches.applied()
    assert (engine.package in sys.modules) == had_engine  # the check stopped before importing any engine module
    # the sidecar learns it too: one notice, held by this (live) process
    (notice,) = read_notices(enabled)
    assert (notice.engine, notice.reason, notice.pid) == (engine.name, "unsupported_version", os.getpid())
    assert f"{engine.name} {engine.unknown_version} is not a version this adapter knows" in notice.detail


@ENGINES
def test_missing_engine_is_one_warning(engine, enabled, monkeypatch, caplog):
    def missing():
        raise ModuleNotFoundError(f"No package metadata was found for {engine.package}")

    _fresh(engine, monkeypatch)
    monkeypatch.setattr(engine.patches, "installed_version", missing)
    with caplog.at_level(logging.WARNING, logger=engine.logger):
        engine.plugin.register()
    assert len(caplog.records) == 1 and f"{engine.name} is not installed" in caplog.records[0].getMessage()


@ENGINES
def test_disabled_plugin_does_nothing(engine, monkeypatch, caplog):
    _fresh(engine, monkeypatch)
    monkeypatch.delenv("GATHERWISE_ENABLE", raising=False)
    monkeypatch.setattr(engine.patches, "installed_version", lambda: pytest.fail("must not look at the engine"))
    with caplog.at_level(logging.DEBUG, logger=engine.logger):
        engine.plugin.register()
    assert not caplog.records and not engine.patches.applied()


@ENGINES
def test_shape_problem_also_refuses(engine, enabled, monkeypatch, caplog):
    _fresh(engine, monkeypatch)
    monkeypatch.setattr(engine.patches, "compatibility_problems", lambda: ["engine.Sampler.forward is missing"])
    monkeypatch.setattr(engine.patches, "apply", _no_apply)
    with caplog.at_level(logging.WARNING, logger=engine.logger):
        engine.plugin.register()
    assert len(caplog.records) == 1 and "Sampler.forward is missing" in caplog.records[0].getMessage()


@pytest.mark.parametrize("patches,version,ok", [
    *((vllm_patches, v, ok) for v, ok in (("0.32.0", True), ("0.32.3+cpu", True), ("0.32", True), ("0.3.2", False),
                                          ("0.33.0", False), ("0.320.0", False), ("unknown", False))),
    *((sglang_patches, v, ok) for v, ok in (("0.5.23", True), ("0.5.23+cpu", True), ("0.5.23.post1", True),
                                            ("0.5.2", False), ("0.5.230", False), ("0.5.24", False),
                                            ("0.6.0", False), ("unknown", False))),
])
def test_version_supported(patches, version, ok):
    assert version_supported(version, patches.SUPPORTED_VERSIONS) is ok


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
