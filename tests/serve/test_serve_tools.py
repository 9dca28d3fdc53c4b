"""Tool calls over HTTP on CPU (`openai` client, live server, the tiny random model): Hermes
`<tool_call>` and Llama 3.x JSON formats chosen from the chat template; a named or required
tool_choice gives a call whose arguments validate against the tool's parameters, streamed (as
delta.tool_calls fragments) and not, with finish_reason "tool_calls"; role "tool" messages go
through the template; bad tools / tool_choice are 400s naming the field."""
from __future__ import annotations

import json

import pytest

from _checkpoints import write
from _serve_live import LiveServer

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
jsonschema = pytest.importorskip("jsonschema")

from graphrt import LLM  # noqa: E402
from graphrt.engine.tool_calls import check_tools, parse_tool_calls, template_messages, tool_format  # noqa: E402
from graphrt.serve import ServeConfig, create_app  # noqa: E402

NAME = "tiny-llama"
PARAMS = {"type": "object", "properties": {"d": {"type": "integer", "minimum": 1, "maximum": 7}},
          "required": ["d"], "additionalProperties": False}     # short calls: one token a step on CPU
TOOLS = [{"type": "function", "function": {"name": "wx", "description": "weather", "parameters": PARAMS}},
         {"type": "function", "function": {"name": "tz", "parameters": {"type": "object", "properties": {
             "z": {"enum": ["a", "b"]}}, "required": ["z"], "additionalProperties": False}}}]
# short test templates (the tiny model's context is 256 tokens): what a Qwen / Llama 3.1 template does
HERMES = ("{% if tools %}T{{ tools | length }}<tool_call>{% endif %}{% for m in messages %}"
          "{% if m.role == 'tool' %}R:{{ m.content }}|{% elif m.tool_calls %}A:{% for t in m.tool_calls %}"
          "{{ t.function.name }}{{ t.function.arguments | tojson }}{% endfor %}|{% else %}{{ m.role[0] }}:"
          "{{ m.content }}|{% endif %}{% endfor %}{% if add_generation_prompt %}a:{% endif %}")
LLAMA = HERMES.replace("<tool_call>", "ipython")
MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return LLM(write(tmp_path_factory, "serve_tools", arch="llama", dtype="float32", seed=5), device="cpu",
               max_batch=4, steps_per_graph=2, max_model_len=200)


@pytest.fixture(scope="module")
def client(llm):
    with LiveServer(create_app(llm, ServeConfig(served_model_name=NAME, max_waiting=8))) as srv:
        yield openai.OpenAI(base_url=srv.base_url + "/v1", api_key="unused", max_retries=0, timeout=600)


def _schema(name):
    return next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)


@pytest.mark.parametrize("template,fmt", [(HERMES, "hermes"), (LLAMA, "llama3_json")], ids=["hermes", "llama3"])
def test_named_and_required_calls(llm, client, template, fmt):
    llm.tokenizer.chat_template = template
    assert tool_format(llm.tokenizer) == fmt
    r = client.chat.completions.create(model=NAME, messages=MSG, tools=TOOLS, max_tokens=70, temperature=0,
                                       tool_choice={"type": "function", "function": {"name": "wx"}})
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1
    call = c.message.tool_calls[0]
    assert call.function.name == "wx" and call.id.startswith("call_") and call.type == "function"
    jsonschema.validate(json.loads(call.function.arguments), PARAMS)
    if fmt != "hermes":                           # streamed: one format is enough (CPU time)
        return
    chunks = list(client.chat.completions.create(model=NAME, messages=MSG, tools=TOOLS, max_tokens=70, temperature=0,
                                                 tool_choice="required", stream=True))
    frags = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    assert frags and frags[0].id and frags[0].function.name in ("wx", "tz")
    args = "".join(f.function.arguments or "" for f in frags)
    jsonschema.validate(json.loads(args), _schema(frags[0].function.name))
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"


def test_tool_messages_and_auto(llm, client):
    llm.tokenizer.chat_template = HERMES
    conv = MSG + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "wx", "arguments": '{"d": 2}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    text = llm.tokenizer.apply_chat_template(template_messages(conv), add_generation_prompt=True, tokenize=False,
                                             tools=TOOLS)
    assert text == 'T2<tool_call>u:hi|A:wx{"d": 2}|R:sunny|a:'
    r = client.chat.completions.create(model=NAME, messages=conv, tools=TOOLS, tool_choice="auto", max_tokens=6,
                                       temperature=0)
    c = r.choices[0]                                  # the random model writes no call: text
    assert c.finish_reason in ("stop", "length") and c.message.tool_calls is None


def test_parse_formats():
    tools = check_tools(TOOLS)
    content, calls = parse_tool_calls('ok <tool_call>\n{"name": "tz", "arguments": {"z": "a"}}\n</tool_call>',
                                      "hermes", tools)
    assert content == "ok" and calls == [("tz", '{"z": "a"}')]
    assert parse_tool_calls('{"name": "wx", "parameters": {"d": 1}}', "llama3_json", tools) == \
        (None, [("wx", '{"d": 1}')])
    assert parse_tool_calls('{"name": "nope", "parameters": {}}', "llama3_json", tools)[1] == []
    assert parse_tool_calls("plain", "hermes", tools) == ("plain", [])



def test_parse_is_linear_in_hostile_output():
    """A client can steer the output (a regex constraint with tool_choice auto): a `<tool_call>` and
    4,000 spaces took a regular expression 17 s (thousands of unclosed marks: 8 s for 8,000), on
    the server's event loop; the scan is linear, and finds what the regular expression found."""
    import time
    tools = check_tools(TOOLS)
    call = '<tool_call>\n{"name": "tz", "arguments": {"z": "b"}}\n</tool_call>'
    t0 = time.perf_counter()
    for text in ("<tool_call>" + " " * 4000, "<tool_call>" * 8000, "x <tool_call>" * 8000 + " " * 4000 + call):
        assert parse_tool_calls(text, "hermes", tools) == (text, [])     # an unclosed mark: no call
    content, calls = parse_tool_calls("a " + call + " \t" * 4000 + call + " b", "hermes", tools)
    assert content == "a " + " \t" * 4000 + " b" and calls == [("tz", '{"z": "b"}')] * 2
    assert time.perf_counter() - t0 < 1.0


def test_slow_tool_grammars_hold_no_worker(llm, client, monkeypatch):
    """Turning a tool's parameters into a grammar has no bound in xgrammar (a 47-character schema,
    a string pattern [a-z]{1,20000}, takes 22 s). It runs on a pool of its own, waited for on the
    event loop up to the compile timeout (then a 400 naming tools): requests with slow tools (one
    more than the worker pool has threads) held every worker, and a plain request waited."""
    import threading
    import time
    import graphrt.engine.tool_calls as tool_calls
    llm.tokenizer.chat_template = HERMES
    release, build = threading.Event(), tool_calls.tool_constraint

    def slow(tools, *a, **k):
        if tools[0]["name"] == "slow":
            release.wait(30)
        return build(tools, *a, **k)
    monkeypatch.setattr(tool_calls, "tool_constraint", slow)
    monkeypatch.setattr(llm.engine, "compile_timeout_s", 1.0)
    slow_tools = [{"type": "function", "function": {"name": "slow", "parameters": PARAMS}}]
    refused = []

    def ask():
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=NAME, messages=MSG, tools=slow_tools, tool_choice="required",
                                           max_tokens=4)
        refused.append((e.value.body["param"], e.value.body["message"]))
    threads = [threading.Thread(target=ask) for _ in range(5)]
    try:
        for t in threads:
            t.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        r = client.chat.completions.create(model=NAME, messages=MSG, max_tokens=2)
        took = time.monotonic() - t0
        for t in threads:
            t.join(30)
    finally:
        release.set()
    assert r.choices[0].finish_reason in ("stop", "length") and took < 5.0, took
    assert refused == [("tools", "tools: the tool-call grammar was not built within 1 s")] * len(threads), refused

def test_bad_tools(client):
    for kw, param in (({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools"),
                      ({"tools": [{"type": "code"}]}, "tools"),
                      ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "zz"}}}, "tool_choice"),
                      ({"tool_choice": "required"}, "tool_choice"),
                      ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
                          "type": "object", "properties": {"a": {"type": "nope"}}}}}], "tool_choice": "required"},
                       "tools")):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=NAME, messages=MSG, max_tokens=4, **kw)
        assert e.value.body["param"] == param, e.value.body
        assert "\n" not in e.value.body["message"]
