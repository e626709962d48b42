"""A TCP port on 127.0.0.1 that is free now: the engine's rendezvous, the local stack's servers, the benches'.

In the core because floors that must not import each other (the engine's launcher, the local stack) both need it.
"""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
