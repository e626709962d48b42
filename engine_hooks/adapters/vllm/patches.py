"""Every place gatherwise touches vLLM, in one list, with the check that they are what the adapter expects.

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

Before patching, the installed vLLM version must be one the adapter was written and tested against, and each
target must exist with the expected parameters. Otherwise vLLM is left untouched and ONE warning says why.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from gatherwise.engine_hooks.adapters import patch_targets
from gatherwise.engine_hooks.adapters.patch_targets import Target

log = logging.getLogger("gatherwise.vllm")

SUPPORTED_VERSIONS = ("0.32",)  # major.minor of the vLLM releases this adapter was written and tested against

GATHER_LOGITS = Target("vllm.model_executor.layers.logits_processor", "LogitsProcessor", "_gather_logits",
                       ("self", "logits"))
EXECUTE_MODEL = Target("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "execute_model",
                       ("self", "scheduler_output"))
SAMPLER_FORWARD = Target("vllm.v1.sample.sampler", "Sampler", "forward", ("self", "logits", "sampling_metadata"))
DUMMY_SAMPLER_RUN = Target("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_dummy_sampler_run",
                           ("self", "hidden_states"))
PROMPT_LOGPROBS = Target("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_get_prompt_logprobs_dict",
                         ("self", "hidden_states"))
V2_RUNNER = "vllm.v1.worker.gpu.model_runner"
V2_SAMPLE = Target(V2_RUNNER, "GPUModelRunner", "sample", ("self", "hidden_states", "input_batch", "grammar_output"))
V2_SAMPLER_SAMPLE = Target("vllm.v1.worker.gpu.sample.sampler", "Sampler", "sample",
                           ("self", "logits", "expanded_idx_mapping", "idx_mapping", "idx_mapping_np", "pos",
                            "input_ids", "expanded_local_pos", "seq_lens_upper_bound_np"))
V2_DUMMY_SAMPLER_RUN = Target(V2_RUNNER, "GPUModelRunner", "_dummy_sampler_run", ("self", "hidden_states"))
V2_PROMPT_LOGPROBS = Target("vllm.v1.worker.gpu.sample.prompt_logprob", "PromptLogprobsWorker",
                            "compute_prompt_logprobs", ("self", "logits_fn"))
V2_PROMPT_TOKEN_LOGPROBS = Target("vllm.v1.worker.gpu.sample.prompt_logprob", "PromptLogprobsWorker",
                                  "compute_prompt_token_id_logprobs", ("self", "logits_fn"))
UNHOOKED_SCOPES = (DUMMY_SAMPLER_RUN, PROMPT_LOGPROBS, V2_DUMMY_SAMPLER_RUN, V2_PROMPT_LOGPROBS,
                   V2_PROMPT_TOKEN_LOGPROBS)  # vLLM's own logits calls outside a step
TARGETS = (GATHER_LOGITS, EXECUTE_MODEL, SAMPLER_FORWARD, V2_SAMPLE, V2_SAMPLER_SAMPLE, *UNHOOKED_SCOPES)
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
    from gatherwise.engine_hooks.adapters.vllm.v1_step import V1StepHooks
    from gatherwise.engine_hooks.adapters.vllm.v2_step import V2StepHooks
    from gatherwise.engine_hooks.adapters.vllm.worker import VllmWorker

    worker = VllmWorker(config)
    apply(worker, V1StepHooks(worker), V2StepHooks(worker))


def apply(worker: Any, v1: Any, v2: Any) -> None:
    """Wrap the targets so they call into one worker's hooks: `worker` (a VllmWorker) for the logits gather and
    the logits calls outside a step, `v1` (V1StepHooks) and `v2` (V2StepHooks) for each runner's step and
    sampler. Idempotent."""
    if _originals:
        return
    owners = {t: t.owner() for t in TARGETS}
    originals = {t: owners[t].__dict__[t.attr] for t in TARGETS}

    gather_orig = originals[GATHER_LOGITS]

    @functools.wraps(gather_orig)
    def _gather_logits(self, logits):
        return worker.gather_logits(self, logits, gather_orig)

    execute_orig = originals[EXECUTE_MODEL]

    @functools.wraps(execute_orig)
    def execute_model(self, scheduler_output, *args, **kwargs):
        with v1.step(self, scheduler_output):
            return execute_orig(self, scheduler_output, *args, **kwargs)

    forward_orig = originals[SAMPLER_FORWARD]

    @functools.wraps(forward_orig)
    def forward(self, logits, *args, **kwargs):
        return v1.sample(self, forward_orig, logits, *args, **kwargs)

    v2_sample_orig = originals[V2_SAMPLE]

    @functools.wraps(v2_sample_orig)
    def v2_sample(self, hidden_states, input_batch, grammar_output, *args, **kwargs):
        with v2.step(self, input_batch, grammar_output):
            return v2_sample_orig(self, hidden_states, input_batch, grammar_output, *args, **kwargs)

    v2_sampler_orig = originals[V2_SAMPLER_SAMPLE]

    @functools.wraps(v2_sampler_orig)
    def v2_sampler_sample(self, logits, expanded_idx_mapping, idx_mapping, idx_mapping_np, pos, input_ids,
                          expanded_local_pos, seq_lens_upper_bound_np, *args, **kwargs):
        batch = (expanded_idx_mapping, idx_mapping, idx_mapping_np, pos, input_ids, expanded_local_pos,
                 seq_lens_upper_bound_np)
        return v2.sample(self, v2_sampler_orig, logits, batch, *args, **kwargs)

    wrappers = {GATHER_LOGITS: _gather_logits, EXECUTE_MODEL: execute_model, SAMPLER_FORWARD: forward,
                V2_SAMPLE: v2_sample, V2_SAMPLER_SAMPLE: v2_sampler_sample}
    wrappers.update({t: _unhooked_scope(worker, originals[t]) for t in UNHOOKED_SCOPES})
    for target, wrapper in wrappers.items():
        setattr(owners[target], target.attr, wrapper)
    _originals.update(originals)


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
