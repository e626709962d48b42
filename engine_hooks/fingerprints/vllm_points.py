"""The points of vLLM each runner relies on: the adapter's patch targets and the names it uses
(adapters/vllm/targets.py), the runner steps that call them, what the V2 sharded sampler runs of V2's own
(adapters/vllm/v2_keyed.py), and the runners and samplers on the path that gatherwise does not hook."""

from __future__ import annotations

from gatherwise.engine_hooks.adapters.patch_targets import Target
from gatherwise.engine_hooks.adapters.vllm import targets
from gatherwise.engine_hooks.fingerprints.fingerprint import WHOLE_MODULE
from gatherwise.engine_hooks.fingerprints.point import Point, RunnerPoints

ENGINE = "vllm"
LOGITS = "vllm.model_executor.layers.logits_processor"
V1_MODULES = ("vllm.v1.worker.gpu_model_runner", "vllm.v1.sample.sampler")
V2_PACKAGE = "vllm.v1.worker.gpu."
V2_RUNNER = targets.V2_RUNNER
V2_SAMPLER = "vllm.v1.worker.gpu.sample.sampler"
V2_GUMBEL = "vllm.v1.worker.gpu.sample.gumbel"  # v2_keyed.KERNEL's module; that module imports torch
STANDALONE_RUNNER = "vllm.v1.worker.cpu.standalone_model_runner"
CPU_SAMPLER = "vllm.v1.worker.cpu.sampler"
FLASH_SAMPLING = "vllm.v1.worker.gpu.sample.flash_sampler_utils"


def _point(target: Target) -> Point:
    return Point(target.module, f"{target.cls}.{target.attr}")


def _of(*modules: str) -> tuple[Point, ...]:
    return tuple(_point(t) for t in targets.TARGETS if t.module.startswith(modules))


SHARED = (
    *(_point(t) for t in targets.TARGETS if t.module == LOGITS),
    Point(LOGITS, "LogitsProcessor._get_logits"),  # calls the gather
    Point(LOGITS, "LogitsProcessor.forward"),  # soft cap and scale after the gather
    *(Point(module, name) for module, name in targets.USED_NAMES),
)
V1 = RunnerPoints(
    "v1", "vLLM's V1 model runner (GPUModelRunner in v1/worker/gpu_model_runner.py)", shared=SHARED, own=(
        *_of(*V1_MODULES),
        Point(V1_MODULES[0], "GPUModelRunner.sample_tokens"),  # the grammar bitmask, then the sampler
        Point(V1_MODULES[0], "GPUModelRunner._sample"),
    ))
V2 = RunnerPoints(
    "v2", "vLLM's Model Runner V2 (v1/worker/gpu/model_runner.py, and its CPU subclass)", shared=SHARED, own=(
        *_of(V2_PACKAGE),
        Point(V2_RUNNER, "GPUModelRunner.sample_tokens"),  # calls sample(), then writes the tokens on every rank
        Point(V2_RUNNER, "GPUModelRunner.postprocess_sampled"),
        Point("vllm.v1.worker.cpu.model_runner", "CPUModelRunner"),  # a method of its own would bypass the hooks
        Point(V2_SAMPLER, "Sampler.__init__"),  # the sampler state the V2 batch rules read
        Point(V2_SAMPLER, "Sampler.__call__"),
        Point(V2_SAMPLER, "Sampler.get_logprobs_dims"),
        Point(V2_SAMPLER, "Sampler.apply_sampling_params"),  # run on each shard by the sharded sampler
        Point(V2_SAMPLER, "Sampler._sample_random"),  # its kernel launch is what the sharded sampler repeats
        Point(V2_GUMBEL, "gumbel_sample"),
        Point(V2_GUMBEL, "_gumbel_sample_kernel"),
    ), optional=(  # where the logits are computed since 0.34
        Point("vllm.v1.worker.gpu.model_states.interface", "ModelState.compute_sample_logits"),
        Point("vllm.v1.worker.gpu.model_states.default", "DefaultModelState.compute_sample_logits"),
    ))
STANDALONE_CPU = RunnerPoints(
    "standalone_cpu", "vLLM's standalone CPU runner (StandaloneCPUModelRunner with CPUSampler, MRV2 without Triton)",
    shared=SHARED, own=(
        Point(STANDALONE_RUNNER, "StandaloneCPUModelRunner.sample"),
        Point(STANDALONE_RUNNER, "StandaloneCPUModelRunner.sample_tokens"),
        Point(CPU_SAMPLER, "CPUSampler.__call__"),
        Point(CPU_SAMPLER, "CPUSampler.sample"),
        Point(CPU_SAMPLER, "CPUSampler._sample_random"),
    ), hooked=False)
FLASH = RunnerPoints(
    "flash_sampling", "Model Runner V2's FlashSampling (the LM head fused with keyed Gumbel sampling)",
    own=(Point(FLASH_SAMPLING, WHOLE_MODULE),), hooked=False)
RUNNERS = (V1, V2, STANDALONE_CPU, FLASH)
