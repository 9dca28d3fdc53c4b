"""The server's structured-output fields -> the engine's StructuredOutputsParams.

    so = constraint(body)        # from response_format (chat) or vLLM's `structured_outputs`
                                 # extra field; None for free text; APIError 400 naming the field
    relabel(err, body)           # an engine error about `structured_outputs.<kind>` -> the field
                                 # the client wrote (response_format, structured_outputs)

response_format (OpenAI): {"type": "text"} (free), {"type": "json_object"} (any JSON object),
{"type": "json_schema", "json_schema": {"name" (<= 64 of [a-zA-Z0-9_-]), "description"?,
"schema"?, "strict"?}} (the schema's JSON; without "schema" any JSON object). `strict` is
accepted either way: graphrt always constrains the output to the schema.
"""
from __future__ import annotations

import re

from graphrt.serve.errors import APIError, clip

_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def _bad(msg: str, param: str) -> APIError:
    return _named(APIError.bad_request(f"{param}: {msg}", param=param))


def _named(err: APIError) -> APIError:
    """An error that already names the field the client wrote (relabel leaves it)."""
    err.client_field = True
    return err


def _from_response_format(rf) -> dict | None:
    if not isinstance(rf, dict):
        raise _bad("expected an object with a 'type'", "response_format")
    kind = rf.get("type")
    extra = sorted(set(rf) - {"type", "json_schema"})
    if extra:
        raise _bad(f"unknown field {clip(extra[0])}", "response_format")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind != "json_schema":
        raise _bad(f"type must be 'text', 'json_object' or 'json_schema', got {clip(kind)}", "response_format")
    js = rf.get("json_schema")
    if not isinstance(js, dict):
        raise _bad("json_schema: expected an object with 'name' and 'schema'", "response_format")
    unknown = sorted(set(js) - {"name", "description", "schema", "strict"})
    if unknown:
        raise _bad(f"json_schema: unknown field {clip(unknown[0])}", "response_format")
    name = js.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise _bad("json_schema.name: required, at most 64 characters of a-z, A-Z, 0-9, _ and -",
                   "response_format")
    if "strict" in js and not isinstance(js["strict"], bool) and js["strict"] is not None:
        raise _bad("json_schema.strict: expected a boolean", "response_format")
    schema = js.get("schema")
    if schema is None:
        return {"json_object": True}
    if not isinstance(schema, dict):
        raise _bad("json_schema.schema: expected a JSON schema object", "response_format")
    return {"json": schema}


def constraint(body):
    """The request's StructuredOutputsParams, or None (free text). APIError 400 naming the field
    for a malformed one, or both fields given."""
    from graphrt.engine.params import StructuredOutputsParams     # the engine package: import on use
    rf = getattr(body, "response_format", None)
    so = getattr(body, "structured_outputs", None)
    spec = _from_response_format(rf) if rf is not None else None
    field = "response_format"
    if so is not None:
        if spec is not None:
            raise _bad("give response_format or structured_outputs, not both", "structured_outputs")
        if not isinstance(so, dict):
            raise _bad("expected an object (json, regex, choice, grammar or json_object)", "structured_outputs")
        spec, field = {k: v for k, v in so.items() if v is not None}, "structured_outputs"
    if spec is None:
        return None
    try:
        if field == "structured_outputs":
            unknown = sorted(set(spec) - {"json", "regex", "choice", "grammar", "json_object"})
            if unknown:
                raise ValueError(f"structured_outputs: unknown field {clip(unknown[0])} (json, regex, choice, "
                                 f"grammar, json_object)")
        return StructuredOutputsParams(**spec)
    except (ValueError, TypeError) as e:
        raise _named(APIError.bad_request(_relabel_text(str(e), field), param=field)) from None


def _relabel_text(msg: str, field: str) -> str:
    msg = " ".join(msg.split())
    if field == "response_format" and msg.startswith("structured_outputs"):
        head, _, rest = msg.partition(": ")
        kind = head.split(".", 1)[1] if "." in head else ""
        where = {"json": "json_schema.schema", "json_object": "json_object"}.get(kind, kind)
        return f"response_format: {where + ': ' if where else ''}{rest}"
    return msg


def relabel(err: APIError, body) -> APIError:
    """An APIError from the engine about the constraint (its message starts with
    `structured_outputs`): param and message name the field the client used."""
    if not err.message.startswith("structured_outputs") or getattr(err, "client_field", False):
        return err
    field = "response_format" if getattr(body, "response_format", None) is not None else "structured_outputs"
    err.message, err.param = _relabel_text(err.message, field), field
    return err


__all__ = ["constraint", "relabel"]
