"""Tool calling: OpenAI `tools` / `tool_choice` -> the prompt's tools, an output constraint, and
the model's text parsed back into tool calls, in the checkpoint's own format.

    fmt = tool_format(tokenizer)                      # "hermes" | "llama3_json"
    tools = check_tools(raw_tools)                    # ValueError naming tools[i]....
    so = tool_constraint(tools, tool_choice, fmt)     # StructuredOutputsParams or None
    content, calls = parse_tool_calls(text, fmt, tools)   # calls: [(name, arguments JSON text)]
    msgs = template_messages(messages)                # assistant tool_calls' arguments as dicts

Formats (chosen from the chat template: one that writes `<tool_call>` is Hermes-style):
- "hermes" (Qwen2.5, Qwen3, Hermes): each call `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.
- "llama3_json" (Llama 3.1 / 3.2 / 3.3): one call, `{"name": ..., "parameters": {...}}`, optionally after
  `<|python_tag|>`.

tool_choice: "none" (tools shown, free text), "auto" (free text, parsed: a well-formed call is
returned as a tool call), "required" (one call of any tool, constrained), {"type": "function",
"function": {"name": N}} (one call of N, constrained). Constrained calls follow each tool's
`parameters` schema.
"""
from __future__ import annotations

import json
import re

from graphrt.engine.params import MAX_GRAMMAR_CHARS, StructuredOutputsParams

MAX_TOOLS = 128
_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
OPEN, CLOSE = "<tool_call>", "</tool_call>"


def tool_format(tokenizer) -> str:
    """The checkpoint's tool-call format, read from its chat template."""
    t = getattr(tokenizer, "chat_template", None)
    source = " ".join(t.values()) if isinstance(t, dict) else (t or "")
    return "hermes" if "<tool_call>" in source else "llama3_json"


def check_tools(tools) -> list[dict]:
    """OpenAI tools -> [{"name", "description", "parameters"}]; ValueError naming the field."""
    if not isinstance(tools, (list, tuple)) or not tools:
        raise ValueError("tools: expected a non-empty list of {'type': 'function', 'function': {...}}")
    if len(tools) > MAX_TOOLS:
        raise ValueError(f"tools: at most {MAX_TOOLS} tools, got {len(tools)}")
    out, seen = [], set()
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise ValueError(f"tools[{i}]: expected {{'type': 'function', 'function': {{'name': ...}}}}")
        f = t["function"]
        name = f.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"tools[{i}].function.name: required, at most 64 of a-z, A-Z, 0-9, _ and -")
        if name in seen:
            raise ValueError(f"tools[{i}].function.name: {name!r} given twice")
        seen.add(name)
        params = f.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise ValueError(f"tools[{i}].function.parameters: expected a JSON schema object")
        desc = f.get("description")
        if desc is not None and not isinstance(desc, str):
            raise ValueError(f"tools[{i}].function.description: expected a string")
        out.append({"name": name, "description": desc, "parameters": params})
    return out


def chosen(tools: list[dict], tool_choice) -> list[dict] | None:
    """The tools a constrained call may use (None: not constrained). ValueError naming tool_choice."""
    if tool_choice in (None, "none", "auto"):
        return None
    if tool_choice == "required":
        return tools
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function" \
            and isinstance(tool_choice.get("function"), dict):
        name = tool_choice["function"].get("name")
        hit = [t for t in tools if t["name"] == name]
        if not hit:
            raise ValueError(f"tool_choice: function {str(name)[:64]!r} is not among the tools")
        return hit
    raise ValueError("tool_choice: expected 'none', 'auto', 'required' or {'type': 'function', "
                     "'function': {'name': ...}}")


def _call_schema(tool: dict, fmt: str) -> dict:
    key = "arguments" if fmt == "hermes" else "parameters"
    return {"type": "object", "properties": {"name": {"const": tool["name"]}, key: tool["parameters"]},
            "required": ["name", key], "additionalProperties": False}


def tool_constraint(tools: list[dict], tool_choice, fmt: str) -> StructuredOutputsParams | None:
    """The output constraint of a required / named tool_choice (None for none / auto)."""
    use = chosen(tools, tool_choice)
    if use is None:
        return None
    schema = _call_schema(use[0], fmt) if len(use) == 1 else {"anyOf": [_call_schema(t, fmt) for t in use]}
    if fmt != "hermes":
        return StructuredOutputsParams(json=schema)
    import xgrammar as xgr
    try:
        body = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, strict_mode=True)
    except Exception as e:
        raise ValueError(f"tools: a function's parameters are not a usable JSON schema: "
                         f"{' '.join(str(e).split())[:200]}") from None
    text = str(xgr.Grammar.concat(xgr.Grammar.from_ebnf('root ::= "<tool_call>\\n"'), body,
                                  xgr.Grammar.from_ebnf('root ::= "\\n</tool_call>"')))
    if len(text) > MAX_GRAMMAR_CHARS:
        raise ValueError(f"tools: the tool-call grammar is {len(text)} characters, at most {MAX_GRAMMAR_CHARS}")
    return StructuredOutputsParams(grammar=text)


def _call(obj, fmt: str, names: set) -> tuple[str, str] | None:
    key = "arguments" if fmt == "hermes" else "parameters"
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get(key, obj.get("arguments", {}))
    if not isinstance(args, dict):
        return None
    return obj["name"], json.dumps(args, ensure_ascii=False)


def _hermes_blocks(text: str) -> tuple[list[str], str]:
    """text -> (the inside of each `<tool_call>...</tool_call>` block, stripped; the text outside
    them). Found left to right with str.find, in time linear in the text: the output is the
    model's, which a client can steer (a regular expression here backtracked for seconds on a
    `<tool_call>` followed by a few thousand spaces, on the server's event loop)."""
    blocks, outside, at = [], [], 0
    while (i := text.find(OPEN, at)) >= 0 and (j := text.find(CLOSE, i + len(OPEN))) >= 0:
        outside.append(text[at:i])
        blocks.append(text[i + len(OPEN):j].strip())
        at = j + len(CLOSE)
    outside.append(text[at:])
    return blocks, "".join(outside)


def parse_tool_calls(text: str, fmt: str, tools: list[dict]) -> tuple[str | None, list[tuple[str, str]]]:
    """The model's text -> (content, [(function name, arguments JSON text)]). Text that is not a
    well-formed call of a listed tool stays content."""
    names = {t["name"] for t in tools}
    if fmt == "hermes":
        blocks, rest = _hermes_blocks(text)
        calls = []
        for block in blocks:
            try:
                c = _call(json.loads(block), fmt, names)
            except ValueError:
                c = None
            if c is None:
                return text, []
            calls.append(c)
        if not calls:
            return text, []
        return (rest.strip() or None), calls
    body = text.strip()
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>"):].strip()
    if not body.startswith("{"):
        return text, []
    try:
        c = _call(json.loads(body), fmt, names)
    except ValueError:
        return text, []
    return (None, [c]) if c is not None else (text, [])


def template_messages(messages: list[dict]) -> list[dict]:
    """OpenAI messages -> what chat templates read: an assistant's tool_calls with their
    `arguments` as a dict (the templates write `arguments | tojson`), a tool message's content
    as text. ValueError naming the message for unparsable arguments."""
    out = []
    for i, m in enumerate(messages):
        m = dict(m)
        calls = m.get("tool_calls")
        if calls:
            fixed = []
            for j, c in enumerate(calls):
                f = dict(c.get("function") or {})
                args = f.get("arguments")
                if isinstance(args, str):
                    try:
                        f["arguments"] = json.loads(args) if args.strip() else {}
                    except ValueError:
                        raise ValueError(f"messages[{i}].tool_calls[{j}].function.arguments: not valid JSON") from None
                fixed.append({**c, "function": f, "name": f.get("name"), "arguments": f.get("arguments")})
            m["tool_calls"] = fixed
        if m.get("content") is None:
            m["content"] = ""
        out.append(m)
    return out


__all__ = ["tool_format", "check_tools", "chosen", "tool_constraint", "parse_tool_calls", "template_messages",
           "MAX_TOOLS"]
