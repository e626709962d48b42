"""A 63-bit hash that is the same in every process and on every host (unlike hash(), which is salted per
process): what ranks compare in the install handshake, and seeds derived from names."""

from __future__ import annotations

import hashlib

HASH_BYTES = 8  # 64 bits, shifted to 63 so the value fits a signed int64 (a torch tensor element)


def stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=HASH_BYTES).digest(), "little") >> 1
