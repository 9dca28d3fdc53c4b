"""Tool calls in chat responses: the model's text -> OpenAI `tool_calls`, whole or streamed.

    calls = ToolCalls(fmt, tools, tool_choice)      # fmt, tools: engine/tool_calls.py
    content, tcs = calls.whole(text)                # a non-streamed message
    now = calls.feed(index, text)                   # streaming: content that may go out now
    content, tcs = calls.finish(index)              # at the choice's end: held text, the calls
    fragments(tcs)                                  # delta.tool_calls items (OpenAI's shape)

Streaming holds back only what may start a call (Hermes: a tail that could begin
`<tool_call>`; Llama 3.x JSON: an output that begins with `{`); from a call's start on, the text
is held to the end, parsed, and sent as tool-call fragments: the first with index, id, type and
the function's name, then its `arguments` in pieces.
"""
from __future__ import annotations

import uuid

from graphrt.serve.protocol import ToolCall, ToolCallFunction

MARK = "<tool_call>"
PYTHON_TAG = "<|python_tag|>"
PIECE = 24                       # characters of arguments per streamed fragment


class ToolCalls:
    def __init__(self, fmt: str, tools: list[dict]):
        from graphrt.engine.tool_calls import parse_tool_calls     # the engine package: import on use
        self.fmt, self.tools, self._parse = fmt, tools, parse_tool_calls
        self._buf: dict[int, str] = {}
        self._mode: dict[int, str] = {}             # "text" | "call" (absent: undecided)

    def whole(self, text: str) -> tuple[str | None, list[ToolCall]]:
        content, calls = self._parse(text, self.fmt, self.tools)
        return content, [_tool_call(n, a) for n, a in calls]

    def feed(self, index: int, text: str) -> str:
        buf = self._buf.get(index, "") + text
        mode = self._mode.get(index)
        out = ""
        if mode == "call":
            pass
        elif self.fmt == "hermes":
            i = buf.find(MARK)
            if i >= 0:
                out, buf, self._mode[index] = buf[:i], buf[i:], "call"
            else:
                keep = next((k for k in range(min(len(MARK) - 1, len(buf)), 0, -1) if MARK.startswith(buf[-k:])), 0)
                out, buf = buf[:len(buf) - keep], buf[len(buf) - keep:]
        elif mode == "text":
            out, buf = buf, ""
        else:
            s = buf.lstrip()
            if s.startswith("{") or s.startswith(PYTHON_TAG):
                self._mode[index] = "call"
            elif s and not PYTHON_TAG.startswith(s):
                self._mode[index] = "text"
                out, buf = buf, ""
        self._buf[index] = buf
        return out

    def finish(self, index: int) -> tuple[str | None, list[ToolCall]]:
        buf = self._buf.pop(index, "")
        if self._mode.pop(index, None) != "call":
            return (buf or None), []
        content, calls = self.whole(buf)
        return content, calls


def _tool_call(name: str, arguments: str) -> ToolCall:
    return ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", function=ToolCallFunction(name=name, arguments=arguments))


def fragments(calls: list[ToolCall]) -> list[list[dict]]:
    """Streamed delta.tool_calls, one list per chunk: per call, its head (index, id, type, name,
    arguments "") then its arguments in PIECE-character pieces."""
    out = []
    for i, c in enumerate(calls):
        out.append([{"index": i, "id": c.id, "type": "function",
                     "function": {"name": c.function.name, "arguments": ""}}])
        args = c.function.arguments
        for a in range(0, len(args), PIECE):
            out.append([{"index": i, "function": {"arguments": args[a:a + PIECE]}}])
    return out


__all__ = ["ToolCalls", "fragments"]
