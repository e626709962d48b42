"""The vLLM plugin refuses a vLLM it does not know: hooks off, vLLM untouched, one clear warning.

Runs without vLLM: the version check and the class shapes are faked, never vLLM itself.
"""

from __future__ import annotations

import logging
import sys

import pytest

from engine_hooks.adapters import vllm_patches, vllm_plugin


@pytest.fixture
def fresh_plugin(monkeypatch):
    monkeypatch.setattr(vllm_plugin, "_registered", False)
    monkeypatch.setenv("GATHERWISE_ENABLE", "1")
    yield
    vllm_patches.remove()


def _no_apply(hooks):
    raise AssertionError("vLLM must not be patched")


def test_unknown_version_leaves_vllm_untouched_with_one_warning(fresh_plugin, monkeypatch, caplog):
    monkeypatch.setattr(vllm_patches, "installed_vllm_version", lambda: "0.99.1")
    monkeypatch.setattr(vllm_patches, "apply", _no_apply)
    had_vllm = "vllm" in sys.modules
    with caplog.at_level(logging.WARNING, logger="gatherwise.vllm"):
        vllm_plugin.register()
        vllm_plugin.register()  # vLLM may call a plugin more than once
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    text = warnings[0].getMessage()
    assert "vLLM 0.99.1 is not a version this adapter knows" in text and "0.32.x" in text
    assert "leaves vLLM untouched" in text
    assert not vllm_patches.applied()
    assert ("vllm" in sys.modules) == had_vllm  # the check stopped before importing any vLLM module


def test_disabled_plugin_does_nothing(monkeypatch, caplog):
    monkeypatch.setattr(vllm_plugin, "_registered", False)
    monkeypatch.delenv("GATHERWISE_ENABLE", raising=False)
    monkeypatch.setattr(vllm_patches, "installed_vllm_version", lambda: pytest.fail("must not look at vLLM"))
    with caplog.at_level(logging.DEBUG, logger="gatherwise.vllm"):
        vllm_plugin.register()
    assert not caplog.records and not vllm_patches.applied()


@pytest.mark.parametrize("version,ok", [("0.32.0", True), ("0.32.3+cpu", True), ("0.32", True), ("0.3.2", False),
                                        ("0.33.0", False), ("0.320.0", False), ("unknown", False)])
def test_version_supported(version, ok):
    assert vllm_patches.version_supported(version) is ok


class _Processor:
    def _gather_logits(self, logits):
        return logits


class _Runner:
    def execute_model(self, scheduler_output, intermediate_tensors=None):
        return None


class _RenamedSampler:
    def forward(self, logits, metadata):  # a vLLM where the parameter was renamed
        return logits


def test_shape_check_names_what_changed():
    classes = {vllm_patches.GATHER_LOGITS: _Processor, vllm_patches.EXECUTE_MODEL: _Runner,
               vllm_patches.SAMPLER_FORWARD: _RenamedSampler}
    problems = vllm_patches.target_problems(classes)
    assert len(problems) == 1 and "Sampler.forward" in problems[0] and "sampling_metadata" in problems[0]
    classes[vllm_patches.EXECUTE_MODEL] = object
    assert any("GPUModelRunner.execute_model is missing" in p for p in vllm_patches.target_problems(classes))


def test_shape_problem_also_refuses(fresh_plugin, monkeypatch, caplog):
    monkeypatch.setattr(vllm_patches, "compatibility_problems",
                        lambda: ["vllm.v1.sample.sampler.Sampler.forward is missing"])
    monkeypatch.setattr(vllm_patches, "apply", _no_apply)
    with caplog.at_level(logging.WARNING, logger="gatherwise.vllm"):
        vllm_plugin.register()
    assert len(caplog.records) == 1 and "Sampler.forward is missing" in caplog.records[0].getMessage()
