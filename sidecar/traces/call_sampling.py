"""Which calls are traced: a function of the call index alone, so that every node's sidecar traces the same calls
(each one's spans of a call then meet in one trace: gatherwise.sidecar.traces.call_ids).

Every `every_nth` call index, plus each call whose index, multiplied by 2^64 / φ modulo 2^64 (Fibonacci
hashing), falls below `sample_ratio` × 2^64. The products of consecutive indices are spread evenly over the
range, so any run of calls has its share of traced ones, and the decision costs one multiplication: ingest asks
it of every joined call.
"""

from __future__ import annotations

_GOLDEN = 0x9E3779B97F4A7C15  # 2^64 / φ, odd
_MASK = (1 << 64) - 1


class CallSampling:
    def __init__(self, sample_ratio: float, every_nth: int) -> None:
        self.every_nth = every_nth
        self._below = int(min(max(sample_ratio, 0.0), 1.0) * 2**64)  # sampled: hashed index below this

    def __call__(self, call_index: int) -> bool:
        if self.every_nth > 0 and call_index % self.every_nth == 0:
            return True
        return (call_index * _GOLDEN) & _MASK < self._below
