"""The points of SGLang its one runner relies on: the adapter's wrapped functions and the names it uses
(adapters/sglang/targets.py), and the steps between the logits gather and the sampler that call them."""

from __future__ import annotations

from gatherwise.engine_hooks.adapters.sglang import targets
from gatherwise.engine_hooks.fingerprints.point import Point, RunnerPoints

ENGINE = "sglang"
MODEL_RUNNER = "sglang.srt.model_executor.model_runner"

SGLANG = RunnerPoints("sglang", "SGLang's TP model worker and sampler", own=(
    *(Point(t.module, f"{t.cls}.{t.attr}") for t in targets.TARGETS),
    *(Point(module, name) for module, name in targets.USED_NAMES),
    Point(targets.LOGITS_FORWARD.module, "LogitsProcessor._get_logits"),  # the gather, soft cap, padding trim
    Point(MODEL_RUNNER, "ModelRunner._preprocess_logits"),  # penalties, grammar mask, logit bias
    Point(MODEL_RUNNER, "ModelRunner.sample"),  # calls the sampler
    Point(targets.SAMPLER_FORWARD.module, "Sampler._preprocess_logits"),
))
RUNNERS = (SGLANG,)
