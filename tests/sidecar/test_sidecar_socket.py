"""The sidecar's listening socket: the connections it accepts have Nagle off.

asyncio sets TCP_NODELAY only on sockets whose proto says TCP (an accepted socket inherits its listener's). With
Nagle on, a response's header and body writes wait on the client's delayed ACK: every keep-alive request after
the first took about 40 ms. Checked on the transport asyncio makes for an accepted connection, as uvicorn's is.
"""

from __future__ import annotations

import asyncio
import socket

from gatherwise.sidecar.api.cli import bind


def test_accepted_connections_have_nagle_off():
    async def accept_one() -> int:
        listener = bind("127.0.0.1", 0)
        accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                sock = transport.get_extra_info("socket")
                accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
        try:
            port = listener.getsockname()[1]
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            nodelay = await asyncio.wait_for(accepted, 10)
            writer.close()
            return nodelay
        finally:
            server.close()
            await server.wait_closed()

    assert asyncio.run(accept_one()) != 0
