"""Which SGLang batches gatherwise's own sampler takes under `engine.sampler: gatherwise`, and their rows.

gatherwise's sampler runs at the logits gather, before anything SGLang does between the gather and its sampler
(SGLang 0.5.23: `ModelRunner.sample` -> `_preprocess_logits`, the watermark, `Sampler.forward`). So it takes a
batch only where none of those steps would change the logits or read them: a batch it cannot honour exactly
keeps SGLang's sampler, and `refusal` names why. All-greedy batches keep their own route (SGLang's argmax, or
the sharded argmax): they are exact already.

A row's parameters come from the batch's SamplingBatchInfo tensors, SGLang's "off" encodings normalised
(top_k of TOP_K_ALL or at least the vocab: off; top_k = 1, SGLang's greedy: temperature 0, gatherwise's greedy);
its key (gatherwise.engine_hooks.adapters.sampler_rows) from the request (`Req.rid`, its own
`sampling_params.sampling_seed`) and the index of the token being produced in its output: the sequence length
after this step minus the prompt length (`seq_lens_cpu - len(origin_input_ids)`), which holds for decode,
prefill, a re-prefill after retraction and the overlap scheduler alike (where `output_ids` lags a step behind).
"""

from __future__ import annotations

from typing import Any

import torch

from gatherwise.engine_hooks.adapters.sampler_rows import sampler_row
from gatherwise.engine_hooks.sampling_params import SamplingParams, SamplingRow

# What SGLang does to a batch's logits or with them between the gather and its sampler, by the batch fields
# (SamplingBatchInfo, ForwardBatch, ScheduleBatch of 0.5.23) that say it will; absent fields count as off.
_INFO_TENSORS = (("logit_bias", "logit bias"), ("acc_additive_penalties", "penalties"),
                 ("acc_scaling_penalties", "penalties"), ("sampling_mask_batch_indices", "sampling-mask capture"))
_INFO_FLAGS = (("has_custom_logit_processor", "a custom logit processor"), ("has_watermark_candidates", "watermarks"))


def refusal(forward_batch: Any, schedule_batch: Any, model_runner: Any, rows: int) -> str | None:
    """Why gatherwise's sampler cannot honour this sampled batch exactly, or None when it can."""
    if forward_batch.return_logprob:
        return "logprobs"  # they need every column of the processed logits on the rank that returns them
    info = forward_batch.sampling_info
    penalizer = getattr(info, "penalizer_orchestrator", None)
    if penalizer is not None and penalizer.is_required:
        return "penalties"
    for name, what in _INFO_TENSORS:
        if getattr(info, name, None) is not None:
            return what
    if getattr(info, "grammars", None):
        return "a grammar"
    for name, what in _INFO_FLAGS:
        if getattr(info, name, False):
            return what
    observer = getattr(model_runner, "sampling_observer", None)
    if observer is not None and observer.is_active(info):
        return "a sampling observer"  # it reads the logits before the grammar mask
    reqs = getattr(schedule_batch, "reqs", None)
    if reqs is None or getattr(schedule_batch, "seq_lens_cpu", None) is None:
        return "no host view of the batch's requests"
    if getattr(schedule_batch, "beam_tail", None) is not None or any(
            getattr(r, "beam_group", None) is not None for r in reqs):
        return "beam search"  # it reads the pre-sample logits itself
    if len(reqs) != rows or len(info) != rows:
        return f"{rows} logit rows for {len(reqs)} requests"
    return None


def row_params(temperature: float, top_p: float, top_k: int, min_p: float, vocab: int) -> SamplingParams:
    """One row's parameters as gatherwise's sampler takes them, from SGLang's encoding (without the seed)."""
    if top_k == 1:  # SGLang's greedy (temperature 0 becomes temperature 1, top_k 1), and any top_k = 1 row
        return SamplingParams()
    return SamplingParams(temperature=temperature, top_k=top_k if 0 < top_k < vocab else 0, top_p=top_p,
                          min_p=min_p)


def batch_rows(info: Any, schedule_batch: Any, vocab: int, sampler_seed: int) -> list[SamplingRow]:
    """The rows of a batch `refusal` accepted, in batch order. One device-to-host copy for all parameters."""
    params = torch.stack([info.temperatures.view(-1).double(), info.top_ps.double(), info.top_ks.double(),
                          info.min_ps.double()]).cpu().tolist()
    seq_lens = schedule_batch.seq_lens_cpu.tolist()
    rows = []
    for i, req in enumerate(schedule_batch.reqs):
        temperature, top_p, top_k, min_p = (column[i] for column in params)
        position = max(0, int(seq_lens[i]) - len(req.origin_input_ids))  # a chunked prefill's dropped token: 0
        rows.append(sampler_row(row_params(temperature, top_p, int(top_k), min_p, vocab),
                                req.sampling_params.sampling_seed, req.rid, position, sampler_seed))
    return rows
