"""uvicorn's h11 protocol with a header and a body timeout: a connection that has not sent a request's complete
headers within the timeout is closed, and so is one that has not sent the request's whole body within the same
time again once its headers were complete.

uvicorn arms its keep-alive timer only after a response, and cancels it as soon as any byte arrives; a client
that connects and sends nothing, or half a request line, holds its connection (and a file descriptor) forever,
and so does one that declares a body and sends it one byte at a time. Here the header timer starts when the
connection opens and again after every response, and stops once a request's headers are complete; the body
timer starts then and stops once the body is complete, whatever the app did with it meanwhile (answered it
unread, refused it, or is still reading). nginx does the same (client_header_timeout, client_body_timeout).
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


def header_timeout_protocol(seconds: float) -> type[H11Protocol]:
    """The protocol class to give uvicorn.Config(http=...), closing a connection whose request headers, or whose
    request body, take longer than `seconds`."""

    class HeaderTimeoutProtocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _body_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # a request's headers are complete
                self._disarm()
            if self.conn.their_state is h11.SEND_BODY:
                if self._body_timer is None:
                    self._body_timer = self.loop.call_later(seconds, self._body_timed_out)
            else:
                self._disarm_body()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request's headers get the same time

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            self._disarm_body()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(seconds, self._headers_timed_out)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _disarm_body(self) -> None:
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None

        def _body_timed_out(self) -> None:
            self._body_timer = None
            if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
                self.transport.close()

        def _headers_timed_out(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutProtocol
