"""The plugin in one process, with real vLLM classes, where the hooks cannot engage; prints one JSON object.

`python -m tests.vllm.hooks_off_run --model DIR --shm-dir DIR --sidecar URL` (GATHERWISE_ENABLE=1 and
GATHERWISE_ENGINE_SHM_DIR set by the test)

1. The fall-through guard: the plugin is registered (vLLM's entry point), then vLLM's own
   `LogitsProcessor._gather_logits` is called twice outside any hooked step, as a runner the adapter does not
   know would call it. Without vLLM's TP group the collective itself then fails; that is vLLM's part, and the
   guard has spoken before it.
2. While this process still runs, the real sidecar on the same shm_dir is asked what it sees (GET /v1/engine,
   /readyz, /metrics).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from tests._engine_harness import engine_run_arguments, http

if TYPE_CHECKING:
    import torch
    from vllm.model_executor.layers.logits_processor import LogitsProcessor


def call_gather_outside_a_step(processor: LogitsProcessor, logits: torch.Tensor) -> str | None:
    try:
        processor._gather_logits(logits)
    except Exception as exc:  # vLLM's all_gather without a TP group
        return type(exc).__name__
    return None


def main() -> None:
    args = engine_run_arguments().parse_args()
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    from gatherwise.engine_hooks.adapters.vllm.plugin import register

    installed = register()
    config = EngineArgs(model=args.model, skip_tokenizer_init=True, max_model_len=256,
                        enforce_eager=True).create_engine_config()
    with set_current_vllm_config(config):
        processor = LogitsProcessor(vocab_size=320)
    shard = torch.zeros(2, 160)
    guard_errors = [call_gather_outside_a_step(processor, shard) for _ in range(2)]
    result = {"installed": installed, "guard_errors": guard_errors, "sidecar": sidecar_view(args.sidecar)}
    print("RESULT " + json.dumps(result), flush=True)


def sidecar_view(url: str, reasons: int = 1, timeout_s: float = 30.0) -> dict:
    """The sidecar's answers once it lists `reasons` notices of this process (or when the time is up)."""
    deadline = time.monotonic() + timeout_s
    while True:
        _, engine = http("GET", f"{url}/v1/engine")
        if len(json.loads(engine)["hooks_off"]) >= reasons or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    ready_status, ready = http("GET", f"{url}/readyz")
    _, metrics = http("GET", f"{url}/metrics")
    return {"engine": json.loads(engine), "readyz": [ready_status, json.loads(ready)], "metrics": metrics}


if __name__ == "__main__":
    main()
