"""The request body's limits: size (`--max-request-bytes`, 413) and deadline (`--body-timeout`, 408).

An ASGI middleware. A body whose declared Content-Length exceeds the size limit is refused
before any of it is read; a chunked body is counted as it arrives and refused once past the
limit, so the server never holds more than `max_bytes` (+ one chunk) of a request in memory. The
whole body must arrive within `timeout_s` of the request's headers (a client trickling a byte
every few seconds cannot hold a request open). Either refusal is an OpenAI error body with
`connection: close` (the rest of the body is never read; server.py closes the connection).
"""
from __future__ import annotations

import asyncio
import json

DEFAULT_MAX_REQUEST_BYTES = 4 * 2**20
CLOSE = {"connection": "close"}


def too_large_message(max_bytes: int, got: int | None = None) -> str:
    size = f"{got} bytes" if got is not None else "more"
    return f"request body: {size} exceeds the server's limit of {max_bytes} bytes (--max-request-bytes)"


def too_slow_message(timeout_s: float) -> str:
    return f"request body: not received whole within {timeout_s:g} s of its headers (--body-timeout)"


def _http_error(status: int, message: str, **kw):
    """starlette's HTTPException, imported here: serve/config.py imports this module without the server."""
    from starlette.exceptions import HTTPException
    return HTTPException(status, message, **kw)


class BodyLimit:
    """ASGI middleware: HTTP request bodies over `max_bytes` get 413, bodies not whole within
    `timeout_s` seconds of the headers get 408 (OpenAI error bodies)."""

    def __init__(self, app, *, max_bytes: int, timeout_s: float = 30.0):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"max_request_bytes: must be an int >= 1, got {max_bytes!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"body_timeout_s: must be a number of seconds > 0, got {timeout_s!r}")
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await _send_error(send, 413, too_large_message(self.max_bytes, int(declared)))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        seen, whole = 0, False

        async def guarded():
            nonlocal seen, whole
            if whole:                                  # after the body: http.disconnect, unbounded
                return await receive()
            try:
                msg = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.0))
            except asyncio.TimeoutError:               # FastAPI passes HTTPException to the handlers
                raise _http_error(408, too_slow_message(self.timeout_s), headers=CLOSE) from None
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes:
                    raise _http_error(413, too_large_message(self.max_bytes), headers=CLOSE)
                whole = not msg.get("more_body", False)
            else:
                whole = True
            return msg
        await self.app(scope, guarded, send)


async def _send_error(send, status: int, message: str) -> None:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": status}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


__all__ = ["BodyLimit", "DEFAULT_MAX_REQUEST_BYTES"]
