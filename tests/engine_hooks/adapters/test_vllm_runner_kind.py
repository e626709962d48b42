"""A vLLM worker engages only on a runner it knows, whose fingerprints engaged: V2's and V1's GPUModelRunner (and
their subclasses) are recognised by the names of the classes they derive from, any other runner (the standalone
CPU runner of 0.34) keeps the hooks off naming its class, and a known runner whose points differ keeps them off
naming the point. Runs without vLLM: the runner classes are stand-ins with vLLM's module and class names."""

from __future__ import annotations

from pathlib import Path

import pytest

from gatherwise.config import GatherwiseConfig
from gatherwise.engine_hooks.adapters import hooks_off
from gatherwise.engine_hooks.adapters.vllm.runner_kind import runner_kind
from gatherwise.engine_hooks.adapters.vllm.worker import VllmWorker
from gatherwise.shm_format.hooks_off import read_notices


def _runner_class(module: str, name: str, *bases: type) -> type:
    return type(name, bases, {"__module__": module})


V2 = _runner_class("vllm.v1.worker.gpu.model_runner", "GPUModelRunner")
V1 = _runner_class("vllm.v1.worker.gpu_model_runner", "GPUModelRunner")
V2_CPU = _runner_class("vllm.v1.worker.cpu.model_runner", "CPUModelRunner", V2)
STANDALONE = _runner_class("vllm.v1.worker.cpu.standalone_model_runner", "StandaloneCPUModelRunner")


class _Check:
    """What a worker asks of the fingerprint check: one runner's refusal."""

    def __init__(self, refusals: dict[str, str | None]) -> None:
        self.refusals = refusals

    def runner_refusal(self, runner: str) -> str | None:
        return self.refusals[runner]

    def engagement(self, runner: str) -> None:
        return None


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> GatherwiseConfig:
    monkeypatch.setattr(hooks_off, "_said", set())  # each test is a fresh worker process
    return GatherwiseConfig.model_validate({"engine": {"shm_dir": str(tmp_path / "shm")}})


def test_runner_kind_by_the_classes_a_runner_derives_from() -> None:
    assert [runner_kind(cls()) for cls in (V2, V1, V2_CPU, STANDALONE)] == ["v2", "v1", "v2", None]


def test_a_runner_gatherwise_does_not_hook_keeps_the_hooks_off_naming_its_class(config: GatherwiseConfig) -> None:
    worker = VllmWorker(config, _Check({"v1": None, "v2": None}))  # type: ignore[arg-type]  # a stand-in check
    assert worker.refused_runner(STANDALONE())
    assert worker.disabled is not None
    assert "vllm.v1.worker.cpu.standalone_model_runner.StandaloneCPUModelRunner" in worker.disabled
    (notice,) = read_notices(config.engine.shm_dir)
    assert notice.reason == "unsupported_feature" and "StandaloneCPUModelRunner" in notice.detail


def test_a_known_runner_whose_points_differ_keeps_the_hooks_off_with_the_reason(config: GatherwiseConfig) -> None:
    reason = "vLLM's Model Runner V2 (...): vllm.v1.worker.gpu.sample.sampler:Sampler.apply_sampling_params: differs"
    worker = VllmWorker(config, _Check({"v1": None, "v2": reason}))  # type: ignore[arg-type]  # a stand-in check
    assert worker.refused_runner(V2_CPU())
    assert worker.disabled == reason
    assert worker.runner_class == "vllm.v1.worker.cpu.model_runner.CPUModelRunner"


def test_a_known_runner_that_engaged_is_not_refused_and_asked_once(config: GatherwiseConfig) -> None:
    worker = VllmWorker(config, _Check({"v1": None, "v2": None}))  # type: ignore[arg-type]  # a stand-in check
    assert not worker.refused_runner(V2())
    assert worker.disabled is None and worker.runner_kind == "v2"
    assert not worker.refused_runner(STANDALONE())  # decided at the first step; later steps ask nothing
    assert worker.route().runner == "vllm.v1.worker.gpu.model_runner.GPUModelRunner"
