"""Every place gatherwise touches vLLM, in one list: the functions the adapter wraps (per runner), with the
leading parameters the wrappers rely on, and the other vLLM names the hooks use at run time.

Its own module so that the wrappers (vllm.patches) and the fingerprint points (gatherwise.engine_hooks.fingerprints.
vllm_points) can both read them without importing each other.
"""

from __future__ import annotations

from gatherwise.engine_hooks.adapters.patch_targets import Target

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
RUNNER_TARGETS = {"v1": (EXECUTE_MODEL, SAMPLER_FORWARD, DUMMY_SAMPLER_RUN, PROMPT_LOGPROBS),
                  "v2": (V2_SAMPLE, V2_SAMPLER_SAMPLE, V2_DUMMY_SAMPLER_RUN, V2_PROMPT_LOGPROBS,
                         V2_PROMPT_TOKEN_LOGPROBS)}  # the targets only one runner's modules define
# Other vLLM names the hooks use at run time (checked here too, so a missing one also refuses up front).
USED_NAMES = (("vllm.distributed.parallel_state", "get_tp_group"), ("vllm.distributed.parallel_state", "get_pp_group"),
              ("vllm.v1.outputs", "SamplerOutput"))
