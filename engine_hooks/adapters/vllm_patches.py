"""Every place gatherwise touches vLLM, in one list, with the check that they are what the adapter expects.

Three functions are wrapped (nothing else is replaced):
- `LogitsProcessor._gather_logits(self, logits)`: the TP logits collective -> engine_hooks' collective.
- `GPUModelRunner.execute_model(self, scheduler_output, intermediate_tensors)`: marks the step's logits call.
- `Sampler.forward(self, logits, sampling_metadata, ...)`: in gather mode rank 0 samples, the others receive.

Before patching, the installed vLLM version must be one the adapter was written and tested against, and each
target must exist with the expected parameters. Otherwise vLLM is left untouched and ONE warning says why.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from engine_hooks.adapters import patch_targets
from engine_hooks.adapters.patch_targets import Target

log = logging.getLogger("gatherwise.vllm")

SUPPORTED_VERSIONS = ("0.32",)  # major.minor of the vLLM releases this adapter was written and tested against

GATHER_LOGITS = Target("vllm.model_executor.layers.logits_processor", "LogitsProcessor", "_gather_logits",
                       ("self", "logits"))
EXECUTE_MODEL = Target("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "execute_model",
                       ("self", "scheduler_output"))
SAMPLER_FORWARD = Target("vllm.v1.sample.sampler", "Sampler", "forward", ("self", "logits", "sampling_metadata"))
TARGETS = (GATHER_LOGITS, EXECUTE_MODEL, SAMPLER_FORWARD)
# Other vLLM names the hooks use at run time (checked here too, so a missing one also refuses up front).
USED_NAMES = (("vllm.distributed.parallel_state", "get_tp_group"), ("vllm.distributed.parallel_state", "get_pp_group"),
              ("vllm.v1.outputs", "SamplerOutput"))

_originals: dict[Target, Any] = {}


def installed_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))


def compatibility_problems() -> list[str]:
    """Empty when the adapter may patch this vLLM; else the reasons it must not."""
    return patch_targets.compatibility_problems("vLLM", installed_version, SUPPORTED_VERSIONS, TARGETS, USED_NAMES)


def applied() -> bool:
    return bool(_originals)


def install(config: Any) -> None:
    """Wrap vLLM around the step hooks of `config` (engine_hooks.adapters.plugin calls this once per process)."""
    from engine_hooks.adapters.vllm_step import VllmStepHooks

    apply(VllmStepHooks(config))


def apply(hooks: Any) -> None:
    """Wrap the three targets so they call into `hooks` (a VllmStepHooks). Idempotent."""
    if _originals:
        return
    owners = {t: t.owner() for t in TARGETS}
    originals = {t: owners[t].__dict__[t.attr] for t in TARGETS}

    gather_orig = originals[GATHER_LOGITS]

    @functools.wraps(gather_orig)
    def _gather_logits(self, logits):
        return hooks.gather_logits(self, logits, gather_orig)

    execute_orig = originals[EXECUTE_MODEL]

    @functools.wraps(execute_orig)
    def execute_model(self, *args, **kwargs):
        with hooks.step(self):
            return execute_orig(self, *args, **kwargs)

    forward_orig = originals[SAMPLER_FORWARD]

    @functools.wraps(forward_orig)
    def forward(self, logits, *args, **kwargs):
        return hooks.sample(self, forward_orig, logits, *args, **kwargs)

    for target, wrapper in ((GATHER_LOGITS, _gather_logits), (EXECUTE_MODEL, execute_model),
                            (SAMPLER_FORWARD, forward)):
        setattr(owners[target], target.attr, wrapper)
    _originals.update(originals)


def remove() -> None:
    """Put the original functions back (tests)."""
    for target, fn in _originals.items():
        setattr(target.owner(), target.attr, fn)
    _originals.clear()
