"""How gatherwise wraps SGLang, and the check that SGLang is what the adapter expects (its targets: sglang.targets).

The wrappers are registered with SGLang's own plugin hook registry (`sglang.srt.plugins.hook_registry`), which
SGLang applies in every process right after loading its general plugins; nothing else in SGLang is replaced:
- `TpModelWorker.forward_batch_generation(self, batch, forward_batch, ...)` (around): marks a generation step
  whose logits will be sampled (not a speculative verify pass).
- `LogitsProcessor.__init__` (after): wraps the processor's `_logits_gatherer` (the TP all_gather of the logits
  shards) so that the step's call goes through engine_hooks' collective.
- `LogitsProcessor.forward(self, input_ids, hidden_states, lm_head, logits_metadata, ...)` (around): tells the
  gatherer which forward batch this logits call belongs to; other logits calls keep SGLang's all_gather.
- `Sampler.forward(self, logits_output, sampling_info, return_logprob, ...)` (around): in gather mode rank 0
  samples and its ids reach every rank; the others skip sampling.
- `Sampler._sync_token_ids_across_tp(self, batch_next_token_ids, sampling_info)` (around): SGLang's optional
  all_reduce of the ids; skipped by rank 0 when it samples alone (the others do not join it, and rank 0's ids
  reach them anyway).
- `DecodeCudaGraphRunner._capture_one_stream(self, stream_idx)` (around): SGLang's decode graph capture loop,
  run once per mode of `engine.graph_modes`, the logits gatherer recording that mode (gatherwise.engine_hooks.adapters.
  sglang.graphs).
- `DecodeCudaGraphRunner._make_graph_key(self, size, stream_idx, variant_label, attention_variant)` (around):
  folds the mode being captured or replayed into `variant_label`, so each mode has its own graph per size.
- `DecodeCudaGraphRunner.can_run_graph(self, forward_batch)` (around): picks this step's mode on the host before
  replay; a mode without a graph (sharded) makes the step run eagerly.
- `DecodeCudaGraphRunner.execute(self, forward_batch, pp_proxy_tensors)` (around): the replay of that mode's
  graph, timed, then the host part of the call. All four do nothing unless SGLang captures decode graphs.

Before registering, the installed SGLang's code must match a verified release at every point its runner relies on
(gatherwise.engine_hooks.adapters.engagement), and each target must exist with the expected parameters. Otherwise
SGLang is left untouched and ONE warning says why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gatherwise.engine_hooks.adapters import patch_targets
from gatherwise.engine_hooks.adapters.patch_targets import Target
from gatherwise.engine_hooks.adapters.sglang.graphs import fold_label
from gatherwise.engine_hooks.adapters.sglang.targets import (
    GRAPH_CAN_RUN,
    GRAPH_CAPTURE,
    GRAPH_EXECUTE,
    GRAPH_KEY,
    LOGITS_FORWARD,
    LOGITS_INIT,
    SAMPLER_FORWARD,
    SYNC_TOKEN_IDS,
    TARGETS,
    TP_WORKER_FORWARD,
    USED_NAMES,
)

if TYPE_CHECKING:
    from gatherwise.engine_hooks.fingerprints.engines import InstallCheck

_registered: list[str] = []


def compatibility_problems(check: InstallCheck | None) -> list[str]:
    """Empty when the adapter may patch this SGLang; else the reasons it must not. SGLang has one runner, so
    every target is its."""
    return patch_targets.compatibility_problems("SGLang", TARGETS, USED_NAMES)


def applied() -> bool:
    return bool(_registered)


def install(config: Any, check: InstallCheck | None) -> None:
    """Register the wrappers around the step hooks of `config` (engine_hooks.adapters.plugin calls this once per
    process); the hooks report what `check` matched."""
    from gatherwise.engine_hooks.adapters.sglang.step import SglangStepHooks

    apply(SglangStepHooks(config, check))


class _HookedGatherer:
    """Stands in for a LogitsProcessor's `_logits_gatherer`: the call goes through the hooks, every other
    attribute is the original gatherer's."""

    def __init__(self, original: Any, processor: Any, hooks: Any) -> None:
        self.original, self.processor, self.hooks = original, processor, hooks

    def __call__(self, logits):
        return self.hooks.gather(self.processor, self.original, logits)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.original, name)


def apply(hooks: Any) -> None:
    """Register the wrappers with SGLang's hook registry so they call into `hooks` (an SglangStepHooks).
    Idempotent. SGLang applies them when its plugin loader finishes (load_plugins), in every process."""
    if _registered:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, fn, kind in wrappers(hooks):
        HookRegistry.register(target.name, fn, HookType(kind))
        _registered.append(target.name)


def wrappers(hooks: Any) -> list[tuple[Target, Any, str]]:
    """(target, wrapper, SGLang HookType value) for every target: what apply() hands SGLang."""

    def forward_batch_generation(original, worker, *args, **kwargs):
        with hooks.step(worker, args, kwargs):
            return original(worker, *args, **kwargs)

    def logits_init(result, processor, *args, **kwargs):
        gatherer = getattr(processor, "_logits_gatherer", None)
        if gatherer is not None and not isinstance(gatherer, _HookedGatherer):
            processor._logits_gatherer = _HookedGatherer(gatherer, processor, hooks)

    def logits_forward(original, processor, input_ids, hidden_states, lm_head, logits_metadata, *args, **kwargs):
        with hooks.logits_call(processor, logits_metadata):
            return original(processor, input_ids, hidden_states, lm_head, logits_metadata, *args, **kwargs)

    def sampler_forward(original, sampler, *args, **kwargs):
        return hooks.sample(original, sampler, *args, **kwargs)

    def sync_token_ids(original, sampler, *args, **kwargs):
        if hooks.root_samples_alone:
            return None
        return original(sampler, *args, **kwargs)

    def graph_capture(original, runner, *args, **kwargs):
        return hooks.capture_decode_graphs(original, runner, *args, **kwargs)

    def graph_key(original, runner, size, stream_idx=None, variant_label=None, attention_variant=None):
        mode = hooks.graphs.key_mode
        return original(runner, size, stream_idx, variant_label if mode is None else fold_label(variant_label, mode),
                        attention_variant)

    def graph_can_run(original, runner, forward_batch):
        return hooks.can_replay(original, runner, forward_batch)

    def graph_execute(original, runner, forward_batch, *args, **kwargs):
        return hooks.replay_decode(original, runner, forward_batch, *args, **kwargs)

    return [(TP_WORKER_FORWARD, forward_batch_generation, "around"),
            (LOGITS_INIT, logits_init, "after"),
            (LOGITS_FORWARD, logits_forward, "around"),
            (SAMPLER_FORWARD, sampler_forward, "around"),
            (SYNC_TOKEN_IDS, sync_token_ids, "around"),
            (GRAPH_CAPTURE, graph_capture, "around"),
            (GRAPH_KEY, graph_key, "around"),
            (GRAPH_CAN_RUN, graph_can_run, "around"),
            (GRAPH_EXECUTE, graph_execute, "around")]
