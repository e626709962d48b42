"""Every place gatherwise touches SGLang, in one list: the functions the adapter wraps, with the leading
parameters the wrappers rely on, and the other SGLang names the hooks use at run time.

Its own module so that the wrappers (sglang.patches) and the hooks (sglang.step) can both read a target's shape
without importing each other.
"""

from __future__ import annotations

from gatherwise.engine_hooks.adapters.patch_targets import Target

TP_WORKER_FORWARD = Target("sglang.srt.managers.tp_worker", "TpModelWorker", "forward_batch_generation",
                           ("self", "batch", "forward_batch", "pp_proxy_tensors", "is_verify"))
LOGITS_INIT = Target("sglang.srt.layers.logits_processor", "LogitsProcessor", "__init__", ("self", "config"))
LOGITS_FORWARD = Target("sglang.srt.layers.logits_processor", "LogitsProcessor", "forward",
                        ("self", "input_ids", "hidden_states", "lm_head", "logits_metadata"))
SAMPLER_FORWARD = Target("sglang.srt.layers.sampler", "Sampler", "forward",
                         ("self", "logits_output", "sampling_info", "return_logprob", "top_logprobs_nums",
                          "token_ids_logprobs", "positions"))
SYNC_TOKEN_IDS = Target("sglang.srt.layers.sampler", "Sampler", "_sync_token_ids_across_tp",
                        ("self", "batch_next_token_ids", "sampling_info"))
_DECODE_GRAPHS = ("sglang.srt.model_executor.runner.decode_cuda_graph_runner", "DecodeCudaGraphRunner")
GRAPH_CAPTURE = Target(*_DECODE_GRAPHS, "_capture_one_stream", ("self", "stream_idx"))
GRAPH_KEY = Target(*_DECODE_GRAPHS, "_make_graph_key", ("self", "size", "stream_idx", "variant_label",
                                                         "attention_variant"))
GRAPH_CAN_RUN = Target(*_DECODE_GRAPHS, "can_run_graph", ("self", "forward_batch"))
GRAPH_EXECUTE = Target(*_DECODE_GRAPHS, "execute", ("self", "forward_batch", "pp_proxy_tensors"))
TARGETS = (TP_WORKER_FORWARD, LOGITS_INIT, LOGITS_FORWARD, SAMPLER_FORWARD, SYNC_TOKEN_IDS, GRAPH_CAPTURE,
           GRAPH_KEY, GRAPH_CAN_RUN, GRAPH_EXECUTE)
# Other SGLang names the hooks use at run time (checked with the targets, so a missing one also refuses up front).
USED_NAMES = (("sglang.srt.distributed.parallel_state", "get_tp_group"),
              ("sglang.srt.runtime_context", "get_server_args"),
              ("sglang.srt.runtime_context", "get_parallel"),
              ("sglang.srt.plugins.hook_registry", "HookRegistry"),
              ("sglang.srt.plugins.hook_registry", "HookType"),
              ("sglang.srt.model_executor.forward_batch_info", "ForwardBatch"),
              ("sglang.srt.environ", "envs"))
