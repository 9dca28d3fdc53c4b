"""Errors as OpenAI JSON bodies: {"error": {"message", "type", "param", "code"}}, HTTP status = code.

400 bad request (unknown model, prompt longer than the context, bad sampling values, malformed
JSON, unsupported fields, text the tokenizer or chat template refuses), 404 unknown route, 408
headers or body not received in time, 413 body over --max-request-bytes, 503 queue full / engine
down / too many connections / shutting down, 500 engine failure or any other error.
A streaming response that fails after its headers were sent carries the same body as an SSE
`data:` event (see `sse_error`).

A value from the request that an error quotes (a model name, a logit_bias key, a path) is clipped
to `ECHO_CHARS` characters with a marker saying how long it was (`clip`); every message, in the
body and in the log line, is clipped to `MESSAGE_CHARS`, so no request makes a large error or log.
"""
from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("graphrt.serve")
ECHO_CHARS = 200            # of one request value quoted in an error
MESSAGE_CHARS = 2000        # of a whole error message (body and log line)
TYPES = {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error",
         408: "timeout_error", 413: "invalid_request_error", 500: "internal_error", 503: "service_unavailable"}


def clip(value, most: int = ECHO_CHARS) -> str:
    """str(value) (a str as repr, quoted) cut to `most` characters plus a marker naming its length."""
    text = repr(value) if isinstance(value, str) else str(value)
    if len(text) <= most:
        return text
    return f"{text[:most]}...[{len(text)} characters, clipped]"


class APIError(Exception):
    """An error the client gets as an OpenAI error body with HTTP `status`."""

    def __init__(self, status: int, message: str, *, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    @classmethod
    def bad_request(cls, message: str, *, param: str | None = None) -> "APIError":
        return cls(400, message, param=param)

    @classmethod
    def from_value_error(cls, e: ValueError, *, param_map: dict | None = None) -> "APIError":
        """The engine's ValueErrors start with the field they are about ("prompt: ...")."""
        msg = str(e)
        field = msg.split(":", 1)[0] if ":" in msg else None
        if field is not None and not field.replace("_", "").isalnum():
            field = None
        if field is not None and param_map:
            field = param_map.get(field, field)
        return cls(400, msg, param=field)

    def renamed(self, names: dict[str, str]) -> "APIError":
        """The error with its field renamed as the client sent it (names: engine field -> request
        field, e.g. chat's top_logprobs is the engine's logprobs): param and the message's leading
        "field:" both."""
        new = names.get(self.param) if self.param is not None else None
        if new is not None:
            if self.message.startswith(self.param + ":"):
                self.message = new + self.message[len(self.param):]
            self.param = new
        return self

    def body(self) -> dict:
        return error_body(self.status, self.message, param=self.param)


def error_body(status: int, message: str, *, param: str | None = None) -> dict:
    # a lone surrogate echoed from the request must not make the error itself unencodable
    message = _bounded(message)
    if param is not None:
        param = _bounded(param, ECHO_CHARS)
    return {"error": {"message": message, "type": TYPES.get(status, "error"), "param": param,
                      "code": status}}


def _bounded(text: str, most: int = MESSAGE_CHARS) -> str:
    """text clipped to `most` characters (with a marker), a lone surrogate escaped."""
    if len(text) > most:
        text = f"{text[:most]}...[{len(text)} characters, clipped]"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def sse_error(e: APIError) -> str:
    return f"data: {json.dumps(e.body())}\n\n"


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    parts, param = [], None
    for err in exc.errors():
        loc = [clip(x) if isinstance(x, str) and len(x) > ECHO_CHARS else str(x)   # a dict key is the client's
               for x in err.get("loc", ()) if x != "body"]
        if err.get("type") == "json_invalid":
            return f"malformed JSON body: {err.get('msg')}", None
        where = ".".join(loc) or "body"
        if err.get("type") == "extra_forbidden":
            parts.append(f"{where}: unsupported field")
        else:
            parts.append(f"{where}: {err.get('msg')}")
        param = param or (loc[0] if loc else None)
    return "; ".join(parts) or "invalid request", param


def log_refusal(request: Request, status: int, message: str) -> None:
    """One log line saying why a request was refused (503: warning, others: info)."""
    log.log(logging.WARNING if status >= 500 else logging.INFO, "refused %s %s: %d %s",
            request.method, _bounded(request.url.path, ECHO_CHARS), status, _bounded(message))


def install_handlers(app: FastAPI) -> None:
    """Every error leaves the server as an OpenAI error body, and is logged with its reason."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        log_refusal(request, exc.status, exc.message)
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        log_refusal(request, 400, message)
        return JSONResponse(error_body(400, message, param=param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        log_refusal(request, exc.status_code, str(exc.detail))
        return JSONResponse(error_body(exc.status_code, str(exc.detail)), status_code=exc.status_code,
                            headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):   # a bug: JSON 500, traceback logged
        log.error("%s %s: unhandled %s", request.method, _bounded(request.url.path, ECHO_CHARS), type(exc).__name__,
                  exc_info=(type(exc), exc, exc.__traceback__))
        return JSONResponse(error_body(500, f"internal error: {type(exc).__name__}"), status_code=500)


__all__ = ["APIError", "clip", "ECHO_CHARS", "MESSAGE_CHARS", "error_body", "sse_error", "install_handlers"]
