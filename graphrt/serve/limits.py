"""The request-body size limit (`--max-request-bytes`): an ASGI middleware answering 413.

A body whose Content-Length exceeds the limit is refused before any of it is read; a chunked
body is counted as it arrives and refused once past the limit, so the server never holds more
than `max_bytes` (+ one chunk) of a request in memory.
"""
from __future__ import annotations

import json

from starlette.exceptions import HTTPException

DEFAULT_MAX_REQUEST_BYTES = 4 * 2**20


def too_large_message(max_bytes: int, got: int | None = None) -> str:
    size = f"{got} bytes" if got is not None else "more"
    return f"request body: {size} exceeds the server's limit of {max_bytes} bytes (--max-request-bytes)"


class BodyLimit:
    """ASGI middleware: HTTP requests with a body over `max_bytes` get an OpenAI error body, 413."""

    def __init__(self, app, *, max_bytes: int):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"max_request_bytes: must be an int >= 1, got {max_bytes!r}")
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await _send_413(send, too_large_message(self.max_bytes, int(declared)))
        seen = 0

        async def counted():
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes:            # FastAPI passes HTTPException to the handlers
                    raise HTTPException(413, too_large_message(self.max_bytes))
            return msg
        await self.app(scope, counted, send)


async def _send_413(send, message: str) -> None:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": 413}}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


__all__ = ["BodyLimit", "DEFAULT_MAX_REQUEST_BYTES"]
