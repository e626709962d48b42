"""Which vLLM V1 batches gatherwise's own sampler takes under `engine.sampler: gatherwise`, and their rows.

gatherwise's sampler (gatherwise.engine_hooks.shard_sampling) draws from the logits that leave the TP
collective, with temperature, top-k, top-p and min-p, in every mode alike. vLLM 0.32's V1 runner does more
between the collective and its draw: `LogitsProcessor` applies its soft cap and scale, `sample_tokens` the
grammar bitmask of structured-output requests, and `Sampler.forward` the allowed-token mask, bad words, the
logits processors (min-tokens, logit bias, min-p, any custom one), penalties and the thinking budget (whose
state it updates), and takes logprobs from the full logits. A batch goes to gatherwise's sampler only where
everything vLLM would do to it is something gatherwise does itself (`step_aside_reason` is None); the rest
keep vLLM's sampler. Every rank decides from what it holds alike (the broadcast scheduler output and the
sampling metadata built from it), so every rank reaches the same decision.

The rows come from the runner's request states (`GPUModelRunner.requests`, in the input batch's order): the
`SamplingParams` that vLLM's input batch copies into the sampling metadata's tensors (temperature, top-p,
top-k; min-p goes to vLLM's min-p logits processor), read on the host (no device copy is waited for) and
normalised to gatherwise's "off" values; the request's own seed (the metadata holds only the generator vLLM
built from it); and the number of tokens the request has produced so far, the index of the one now drawn.
"""

from __future__ import annotations

from typing import Any

from gatherwise.engine_hooks.adapters.sampler_rows import sampler_row
from gatherwise.engine_hooks.sampling_params import SamplingParams, SamplingRow

_BUILTIN_LOGITSPROCS = "vllm.v1.sample.logits_processor.builtin"
_MIN_P = "MinPLogitsProcessor"  # the one built-in whose effect gatherwise's sampler applies itself
_SAMPLING_EPS = 1e-5  # vLLM's: a temperature below it is greedy (SamplingParams.sampling_type)


def is_builtin(proc: Any) -> bool:
    return type(proc).__module__ == _BUILTIN_LOGITSPROCS


def builtin_is_idle(proc: Any) -> bool:
    """A logits processor known to rewrite no logit this step: vLLM's built-in logit-bias and min-tokens
    processors hold per-request state only for the requests they act on. Any other processor: False."""
    state = getattr(proc, "biases", getattr(proc, "min_toks", None))
    return state is not None and not state


def step_aside_reason(metadata: Any, processor: Any, structured: bool) -> str | None:
    """Why vLLM's sampler must sample this (not all-greedy) batch, or None when gatherwise's sampler honours
    everything vLLM would apply to it. `processor`: vLLM's LogitsProcessor layer; `structured`: the step has
    structured-output requests."""
    if structured:
        return "structured outputs"  # the grammar bitmask comes after the collective, on the full logits
    if getattr(processor, "soft_cap", None) is not None or getattr(processor, "scale", 1.0) != 1.0:
        return "logit soft cap or scale"
    if not metadata.no_penalties:
        return "penalties"
    if metadata.allowed_token_ids_mask is not None:
        return "allowed token ids"
    if metadata.bad_words_token_ids:
        return "bad words"
    if metadata.max_num_logprobs is not None or getattr(metadata, "logprob_token_ids", None):
        return "logprobs"  # vLLM takes them from the full logits of every row
    if any(getattr(metadata, "spec_token_ids", None) or ()):
        return "speculative tokens"
    holder = getattr(metadata, "thinking_budget_state_holder", None)
    if holder is not None and holder.has_tracked_requests():
        return "thinking budget"
    procs = metadata.logitsprocs
    for proc in (*procs.non_argmax_invariant, *procs.argmax_invariant):
        if not is_builtin(proc):
            return "custom logits processor"
        if type(proc).__name__ != _MIN_P and not builtin_is_idle(proc):
            return "logit bias" if hasattr(proc, "biases") else "min tokens"
    return None


def sampler_rows(batch: Any, requests: Any, rows: int, sampler_seed: int) -> list[SamplingRow] | None:
    """One row per request of vLLM's InputBatch `batch`, in batch order (`requests`: the runner's request states
    by id); None if the logits rows are not one per request with sampling parameters."""
    req_ids = batch.req_ids
    if len(req_ids) != rows:
        return None
    vocab = batch.vocab_size
    out = []
    for req_id in req_ids:
        state = requests[req_id]
        p = state.sampling_params
        if p is None:
            return None
        if p.temperature < _SAMPLING_EPS:
            params, seed = SamplingParams(), None
        else:
            params = SamplingParams(temperature=float(p.temperature),
                                    top_k=p.top_k if 0 < p.top_k < vocab else 0,  # vLLM: 0, -1 or >= vocab is off
                                    top_p=float(p.top_p),
                                    min_p=float(p.min_p))
            seed = p.seed
        out.append(sampler_row(params, seed, req_id, len(state.output_token_ids), sampler_seed))
    return out
