"""Request bodies sent one byte at a time: a mutation without a valid token is refused before its body is read,
and no body, with a token or without, holds its connection longer than the sidecar's body timeout."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

import pytest

from tests.faults._faults import assert_sidecar_serves, sidecar_with_token

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
DECLARED = 60_000
CONNECTIONS = 20
GIVE_UP_S = 120.0  # a bound on the test's own loop, not a timing assertion: the old sidecar never closed these


def open_put(url: str, path: str, authorization: bytes) -> socket.socket:
    """A PUT whose complete headers declare a DECLARED-byte body, and its first byte."""
    address = urlsplit(url)
    assert address.port is not None
    sock = socket.create_connection((address.hostname, address.port), timeout=60)
    sock.sendall(b"PUT %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n%s"
                 b"Content-Length: %d\r\n\r\n{" % (path.encode(), authorization, DECLARED))
    sock.settimeout(0.05)
    return sock


def trickle_until_closed(socks: list[socket.socket]) -> dict[int, bytes]:
    """Send every socket one more byte in turn, reading whatever comes back, until the sidecar closed each;
    returns what each received."""
    received = {i: b"" for i in range(len(socks))}
    open_ones = set(received)
    deadline = time.monotonic() + GIVE_UP_S
    while open_ones and time.monotonic() < deadline:
        for i in sorted(open_ones):
            try:
                socks[i].sendall(b" ")
                chunk = socks[i].recv(4096)
            except TimeoutError:
                continue
            except OSError:  # reset: the sidecar closed it while bytes were on their way
                chunk = b""
            if chunk:
                received[i] += chunk
            else:
                open_ones.discard(i)
        time.sleep(0.2)
    assert not open_ones, f"{len(open_ones)} of {len(socks)} slow bodies still open after {GIVE_UP_S}s"
    return received


@pytest.mark.parametrize("path", ["/v1/mode", "/v1/policy"])
def test_slow_bodies_are_refused_unread_without_a_token_and_closed_with_one(shm_dir, path):
    proc, url, api = sidecar_with_token(shm_dir, GATHERWISE_SIDECAR_HEADER_TIMEOUT_SECONDS="0.5")
    socks: list[socket.socket] = []
    try:
        # without a valid token: the 401 comes while the body has barely started, and the connection ends
        for authorization in (b"", b"Authorization: Bearer wrong\r\n") * (CONNECTIONS // 2):
            socks.append(open_put(url, path, authorization))
        for answer in trickle_until_closed(socks).values():
            assert answer.startswith(b"HTTP/1.1 401 ") and b"bearer token" in answer, answer
        assert_sidecar_serves(proc, api)

        # with the token, the body still has to arrive within the body timeout
        slow = [open_put(url, path, b"Authorization: Bearer fault-token\r\n") for _ in range(CONNECTIONS)]
        socks += slow
        for answer in trickle_until_closed(slow).values():
            assert answer == b"", answer  # closed unanswered: the request never completed
        assert_sidecar_serves(proc, api)
        assert proc.stop() == 0, "".join(proc.output)
    finally:
        for sock in socks:
            sock.close()
        if proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait(30)
