"""Which calls are traced: a function of the call index alone, so that every node's sidecar traces the same calls
(each one's spans of a call then meet in one trace: gatherwise.sidecar.traces.call_ids).

Every `every_nth` call index, plus each call whose index hashes below `sample_ratio` (a keyed BLAKE2b of the index
as a fraction of 2^64: the same on every host, evenly spread over the indices).
"""

from __future__ import annotations

import hashlib

_KEY = b"gw-sample"


def index_fraction(call_index: int) -> float:
    """The call index hashed to [0, 1)."""
    digest = hashlib.blake2b(call_index.to_bytes(8, "little", signed=False), digest_size=8, person=_KEY).digest()
    return int.from_bytes(digest, "little") / 2**64


def is_sampled(call_index: int, sample_ratio: float, every_nth: int) -> bool:
    if every_nth > 0 and call_index % every_nth == 0:
        return True
    return sample_ratio > 0 and index_fraction(call_index) < sample_ratio
