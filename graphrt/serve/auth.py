"""API-key authentication: `Authorization: Bearer <key>` on every endpoint but /health.

    app.add_middleware(ApiKeyAuth, api_key="sk-...")    # create_app does this when ServeConfig.api_key is set

A pure ASGI middleware (it runs before the route, the body limit and the body itself are read):
a request without the header, with another scheme or another key is answered 401 with an OpenAI
error body and `WWW-Authenticate: Bearer`; the key is compared in constant time and never echoed.
/health stays open for load balancers and supervisors, as in vLLM.
"""
from __future__ import annotations

import hmac
import json

from graphrt.serve.errors import error_body

OPEN_PATHS = ("/health",)


class ApiKeyAuth:
    """ASGI middleware: HTTP requests to any path but OPEN_PATHS need the bearer key."""

    def __init__(self, app, *, api_key: str):
        if not isinstance(api_key, str) or not api_key:
            raise ValueError("api_key: expected a non-empty string")
        self.app = app
        self._key = api_key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path") in OPEN_PATHS or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        body = error_body(401, "authorization: a valid API key is required (header 'Authorization: Bearer <key>')",
                          param="authorization")
        body["error"]["type"] = "invalid_request_error"
        data = json.dumps(body).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": data})

    def _allowed(self, scope) -> bool:
        """The first Authorization header is `Bearer <key>` (scheme case-insensitive, RFC 6750)."""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.strip().partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key)
        return False


__all__ = ["ApiKeyAuth", "OPEN_PATHS"]
