"""The logits dtypes gatherwise supports, by name, with the code each one has on the wire.

The codes are written into every ring header and compared in the install handshake, so they are part of the
shared-memory format: never renumber one. Names only, no torch: the engine side maps them to torch dtypes once
(gatherwise.engine_hooks.torch_dtypes).
"""

from __future__ import annotations

DTYPE_CODES = {"float32": 1, "bfloat16": 2, "float16": 3}
LOGITS_DTYPES = tuple(DTYPE_CODES)  # the names the config, the CLIs and the benchmarks accept
DTYPE_NAMES = {code: name for name, code in DTYPE_CODES.items()}


def dtype_code(dtype: object) -> int:
    """Code of a logits dtype given as "float32", "torch.float32" or a torch.dtype (no torch import)."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_CODES:
        raise ValueError(f"unsupported logits dtype {dtype!r}: expected one of {', '.join(LOGITS_DTYPES)}")
    return DTYPE_CODES[name]


def dtype_name(code: int) -> str:
    return DTYPE_NAMES.get(code, f"unknown({code})")
