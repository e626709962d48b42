"""Which of vLLM's model runners a runner object is, by the classes it derives from, named rather than imported:
a release may lack a runner's module (0.34 has no V1), and importing one to ask would pull in its CUDA stack."""

from __future__ import annotations

RUNNER_CLASSES = {("vllm.v1.worker.gpu.model_runner", "GPUModelRunner"): "v2",  # Model Runner V2, its CPU subclass
                  ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner"): "v1"}  # V1, its CPU subclass


def runner_kind(runner: object) -> str | None:
    """The fingerprinted runner ("v1", "v2") whose class `runner` is or derives from; None for any other class
    (the standalone CPU runner, a runner gatherwise has not read)."""
    for cls in type(runner).__mro__:
        kind = RUNNER_CLASSES.get((cls.__module__, cls.__qualname__))
        if kind is not None:
            return kind
    return None
