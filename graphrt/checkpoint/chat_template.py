"""A checkpoint's chat template rendered with jinja2, as transformers' `apply_chat_template` does.

    template = ChatTemplate(source)                        # compiled once
    text = template.render(messages, add_generation_prompt=True, bos_token="<s>", ...)

The environment is the one transformers documents for Hub templates (untrusted code): jinja2's
immutable sandbox with trim_blocks and lstrip_blocks, the loopcontrols extension, a `tojson` filter
that does not escape HTML (json.dumps, ensure_ascii off), `raise_exception(message)` raising
jinja2's TemplateError, `strftime_now(format)`, and `{% generation %}` blocks (the assistant-mask
marker) rendered as their body. Messages reach the template as transformers passes them: keys
whose value is None dropped, the reasoning text under both `reasoning_content` and `thinking`.
"""
from __future__ import annotations

import json
from datetime import datetime

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")   # the first is the standard name


def _raise_exception(message):
    import jinja2
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


def _generation_extension():
    """`{% generation %}...{% endgeneration %}`: renders its body (graphrt tracks no masks)."""
    import jinja2.ext
    import jinja2.nodes

    class Generation(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()
    return Generation


def _message(m) -> dict:
    if not isinstance(m, dict):
        raise TypeError(f"messages: expected dicts, got {type(m).__name__}")
    m = {k: v for k, v in m.items() if v is not None}
    reasoning = next((m[k] for k in REASONING_FIELDS if m.get(k) is not None), None)
    if reasoning is not None:
        m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
    return m


class ChatTemplate:
    """One compiled template (`source`: the Jinja text). Host only; render is thread-safe."""

    def __init__(self, source: str):
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[_generation_extension(), loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
        self.source = source
        self._template = env.from_string(source)

    def render(self, messages: list, *, add_generation_prompt: bool = False, tools=None, documents=None,
               **kwargs) -> str:
        """The conversation as text; kwargs (bos_token, eos_token, ..., a template's own
        variables) are passed to the template as they are."""
        return self._template.render(messages=[_message(m) for m in messages], tools=tools, documents=documents,
                                     add_generation_prompt=add_generation_prompt, **kwargs)


__all__ = ["ChatTemplate"]
