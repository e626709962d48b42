"""How gatherwise wraps vLLM, and the check that vLLM is what the adapter expects (its targets: vllm.targets).

The logits collective, for both of vLLM's model runners:
- `LogitsProcessor._gather_logits(self, logits)`: the TP logits collective -> engine_hooks' collective.

V1 runner (`vllm.v1.worker.gpu_model_runner`; vllm.v1_step):
- `GPUModelRunner.execute_model(self, scheduler_output, ...)`: marks the step's logits call, and tells the
  hooks whether the step has structured-output requests.
- `Sampler.forward(self, logits, sampling_metadata, ...)`: in gather mode rank 0 samples, the others receive.

Model Runner V2 (`vllm.v1.worker.gpu`, vLLM's default on GPUs; vllm.v2_step):
- `GPUModelRunner.sample(self, hidden_states, input_batch, grammar_output)`: the step's logits call and its
  sampling.
- V2 `Sampler.sample(self, logits, expanded_idx_mapping, ...)`: where a call that the hooks sample (gather on the
  ranks other than 0, sharded) returns its tokens instead of V2's sampling.

More only watch, so that the hooks never go off silently: the logits calls vLLM makes outside a step on
purpose (each runner's `_dummy_sampler_run` warm-up, V1's `_get_prompt_logprobs_dict`, V2's prompt-logprobs
worker) keep vLLM's all_gather without a warning. Any other logits call outside a hooked step is reported once
(vllm.worker).

Before patching, the installed vLLM's code must match a verified release at every point of at least one runner
the hooks take (gatherwise.engine_hooks.adapters.engagement), and each target of the runners the install has must
exist with the expected parameters; a release without V1 (0.34) has V2's targets only. Otherwise vLLM is left
untouched and ONE warning says why.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any

from gatherwise.engine_hooks.adapters import patch_targets
from gatherwise.engine_hooks.adapters.patch_targets import Target
from gatherwise.engine_hooks.adapters.vllm.targets import (
    EXECUTE_MODEL,
    GATHER_LOGITS,
    RUNNER_TARGETS,
    SAMPLER_FORWARD,
    TARGETS,
    UNHOOKED_SCOPES,
    USED_NAMES,
    V2_SAMPLE,
    V2_SAMPLER_SAMPLE,
)

if TYPE_CHECKING:
    from gatherwise.engine_hooks.fingerprints.engines import InstallCheck

log = logging.getLogger("gatherwise.vllm")

_originals: dict[Target, Any] = {}


def present_targets(check: InstallCheck | None) -> tuple[Target, ...]:
    """The targets of the runners the install has (every target without a check): a runner's modules may be gone
    from a release (V1 in 0.34), and its targets with them."""
    absent = {t for runner, targets in RUNNER_TARGETS.items()
              if check is not None and check.engagement(runner) is None for t in targets}
    return tuple(t for t in TARGETS if t not in absent)


def compatibility_problems(check: InstallCheck | None) -> list[str]:
    """Empty when the adapter may patch this vLLM; else the reasons it must not."""
    return patch_targets.compatibility_problems("vLLM", present_targets(check), USED_NAMES)


def applied() -> bool:
    return bool(_originals)


def install(config: Any, check: InstallCheck | None) -> None:
    """Wrap vLLM around the step hooks of `config` (engine_hooks.adapters.plugin calls this once per process);
    each worker asks `check` again once it knows its runner."""
    from gatherwise.engine_hooks.adapters.vllm.v1_step import V1StepHooks
    from gatherwise.engine_hooks.adapters.vllm.v2_step import V2StepHooks
    from gatherwise.engine_hooks.adapters.vllm.worker import VllmWorker

    worker = VllmWorker(config, check)
    apply(worker, V1StepHooks(worker), V2StepHooks(worker), present_targets(check))


def apply(worker: Any, v1: Any, v2: Any, targets: tuple[Target, ...] = TARGETS) -> None:
    """Wrap `targets` so they call into one worker's hooks: `worker` (a VllmWorker) for the logits gather and
    the logits calls outside a step, `v1` (V1StepHooks) and `v2` (V2StepHooks) for each runner's step and
    sampler. Idempotent. Only `targets` are imported, so a release without a runner's modules is patched for the
    runners it has."""
    if _originals:
        return
    owners = {t: t.owner() for t in targets}
    originals = {t: owners[t].__dict__[t.attr] for t in targets}

    for target, original in originals.items():
        setattr(owners[target], target.attr, _wrapper(target, original, worker, v1, v2))
    _originals.update(originals)


def _wrapper(target: Target, original: Any, worker: Any, v1: Any, v2: Any) -> Any:
    """What replaces `target`: a call into the hooks around `original`."""
    if target in UNHOOKED_SCOPES:
        return _unhooked_scope(worker, original)

    def gather_logits(self, logits):
        return worker.gather_logits(self, logits, original)

    def execute_model(self, scheduler_output, *args, **kwargs):
        with v1.step(self, scheduler_output):
            return original(self, scheduler_output, *args, **kwargs)

    def forward(self, logits, *args, **kwargs):
        return v1.sample(self, original, logits, *args, **kwargs)

    def v2_sample(self, hidden_states, input_batch, grammar_output, *args, **kwargs):
        with v2.step(self, input_batch, grammar_output):
            return original(self, hidden_states, input_batch, grammar_output, *args, **kwargs)

    def v2_sampler_sample(self, logits, expanded_idx_mapping, idx_mapping, idx_mapping_np, pos, input_ids,
                          expanded_local_pos, seq_lens_upper_bound_np, *args, **kwargs):
        batch = (expanded_idx_mapping, idx_mapping, idx_mapping_np, pos, input_ids, expanded_local_pos,
                 seq_lens_upper_bound_np)
        return v2.sample(self, original, logits, batch, *args, **kwargs)

    wrappers = {GATHER_LOGITS: gather_logits, EXECUTE_MODEL: execute_model, SAMPLER_FORWARD: forward,
                V2_SAMPLE: v2_sample, V2_SAMPLER_SAMPLE: v2_sampler_sample}
    return functools.wraps(original)(wrappers[target])


def _unhooked_scope(worker: Any, original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(self, *args, **kwargs):
        with worker.unhooked_scope():
            return original(self, *args, **kwargs)

    return wrapper


def remove() -> None:
    """Put the original functions back (tests)."""
    for target, fn in _originals.items():
        setattr(target.owner(), target.attr, fn)
    _originals.clear()
