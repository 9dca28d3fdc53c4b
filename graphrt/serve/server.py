"""The HTTP server around the app: uvicorn with graphrt's connection guards and a bounded shutdown.

    server = build_server(app, host="127.0.0.1", port=8000, log_level="info")   # app: create_app(...)
    server.run(sockets=[sock])

What uvicorn alone leaves open, bounded by ServeConfig (app.state.serve_config):
- max_connections: a connection past the bound gets an OpenAI error body, 503, and is closed at
  once (before it sends anything); the open ones are untouched.
- header_timeout_s: a request's headers must arrive within this many seconds of the connection's
  start, or on a kept-alive connection of the next request's first byte (an idle kept-alive
  connection is closed by uvicorn's keep-alive timeout); a client that sent part of them gets 408
  and is closed (one that sent nothing is closed silently).
  The body's deadline (body_timeout_s) is the app's (limits.py).
- A response sent before its request's body was read whole (413, 408, a route that ignores the
  body) closes the connection: the rest of that body would otherwise keep it open.
- Shutdown (SIGTERM, SIGINT): every in-flight stream ends at once with an error event and every
  waiting whole response with 503 (app.state.bridge.close_streams); requests still arriving get
  `shutdown_timeout_s` (uvicorn's graceful timeout), then their tasks are cancelled and the
  process exits.

The guards live in an h11 protocol subclass (uvicorn's pure-Python HTTP/1.1 parser); their hooks
are the protocol's public asyncio callbacks.
"""
from __future__ import annotations

import http
import json

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from graphrt.serve.errors import error_body


def raw_error(status: int, message: str) -> bytes:
    """A whole HTTP/1.1 response (OpenAI error body, connection: close) for a connection that has
    no request cycle to answer through."""
    body = json.dumps(error_body(status, message)).encode()
    head = (f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
    return head + body


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header deadline and a connection bound; the limits come from
    class attributes set by `guarded_protocol` (uvicorn constructs one protocol per connection)."""

    header_timeout_s: float = 10.0
    max_connections: int = 256

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._header_timer = None
        self._partial = False                          # bytes of a request whose headers are incomplete
        if len(self.connections) > self.max_connections:
            transport.write(raw_error(503, f"server: {len(self.connections) - 1} connections are open, the "
                                           f"limit (max_connections) is {self.max_connections}; retry later"))
            transport.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        if self._header_timer is None and (cycle is None or cycle.response_complete):
            self._arm()                                # the first byte of the next request
        if self._header_timer is not None:
            self._partial = True
        super().data_received(data)
        if self.cycle is not cycle:                    # the headers are in: a new request cycle began
            self._disarm()

    def on_response_complete(self) -> None:
        cycle, unread = self.cycle, self.conn.their_state is h11.SEND_BODY
        super().on_response_complete()
        if self.transport.is_closing():
            return
        if unread:                                     # answered before its body was read whole
            self.transport.close()
        elif self.cycle is cycle and self.conn.trailing_data[0]:   # part of a pipelined request
            self._arm()
            self._partial = True

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._partial = False
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if getattr(self, "_header_timer", None) is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        if self._partial:
            self.transport.write(raw_error(408, f"request headers: not received within {self.header_timeout_s:g} s "
                                                f"(header_timeout_s)"))
        self.transport.close()


def guarded_protocol(*, header_timeout_s: float, max_connections: int) -> type[GuardedH11Protocol]:
    return type("GuardedH11Protocol", (GuardedH11Protocol,),
                {"header_timeout_s": header_timeout_s, "max_connections": max_connections})


class GracefulServer(uvicorn.Server):
    """uvicorn.Server whose shutdown first ends the app's in-flight requests (`on_shutdown`)."""

    def __init__(self, config: uvicorn.Config, *, on_shutdown=None):
        super().__init__(config)
        self.on_shutdown = on_shutdown

    async def shutdown(self, sockets=None) -> None:
        if self.on_shutdown is not None:
            self.on_shutdown()
        await super().shutdown(sockets=sockets)


def build_server(app, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> GracefulServer:
    """app: from create_app (its state carries serve_config and bridge)."""
    cfg = app.state.serve_config
    protocol = guarded_protocol(header_timeout_s=cfg.header_timeout_s, max_connections=cfg.max_connections)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, http=protocol, lifespan="on",
                            timeout_graceful_shutdown=cfg.shutdown_timeout_s)
    return GracefulServer(config, on_shutdown=app.state.bridge.close_streams)


__all__ = ["build_server", "GracefulServer", "GuardedH11Protocol", "guarded_protocol", "raw_error"]
