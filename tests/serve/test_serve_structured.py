"""Structured outputs over HTTP on CPU (`openai` client, live server): response_format json_object /
json_schema (strict) and vLLM's `structured_outputs` extra field, streamed and not; constrained,
free and failing-grammar requests interleaved, every page comes back; bad inputs are 400s naming
the field in one line."""
from __future__ import annotations

import concurrent.futures as cf
import json
import re

import pytest

from _checkpoints import write
from _serve_live import LiveServer

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
jsonschema = pytest.importorskip("jsonschema")

from graphrt import LLM  # noqa: E402
from graphrt.serve import ServeConfig, create_app  # noqa: E402

NAME = "tiny-llama"
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "tag": {"enum": ["a", "b"]}},
          "required": ["ok", "tag"], "additionalProperties": False}
MSG = [{"role": "user", "content": "answer"}]


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return LLM(write(tmp_path_factory, "serve_so", arch="llama", dtype="float32", seed=3), device="cpu",
               max_batch=4, steps_per_graph=2, max_model_len=96)


@pytest.fixture(scope="module")
def client(llm):
    with LiveServer(create_app(llm, ServeConfig(served_model_name=NAME, max_waiting=8))) as srv:
        yield srv.client()


def test_json_schema_streamed_and_not(client):
    rf = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}
    r = client.chat.completions.create(model=NAME, messages=MSG, response_format=rf, max_tokens=30, temperature=0)
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=NAME, messages=MSG, response_format=rf, max_tokens=30, temperature=0, stream=True) if c.choices)
    assert text == r.choices[0].message.content


def test_interleaved_constrained_free_failing(client, llm):
    def constrained(i):
        return client.completions.create(model=NAME, prompt=f"n{i}", max_tokens=8, temperature=1.0, seed=i,
                                         extra_body={"structured_outputs": {"regex": r"[xyz]{3}"}}).choices[0].text

    def free(i):
        return client.completions.create(model=NAME, prompt=f"f{i}", max_tokens=6, temperature=0).choices[0].text

    def failing(i):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model=NAME, prompt="x", max_tokens=4,
                                      extra_body={"structured_outputs": {"regex": "(["}})
        return e.value.body

    with cf.ThreadPoolExecutor(6) as pool:
        got = [pool.submit(f, i) for i in range(2) for f in (constrained, free, failing)]
        res = [g.result() for g in got]
    for i in range(0, len(res), 3):
        assert re.fullmatch(r"[xyz]{3}", res[i])
        assert isinstance(res[i + 1], str)
        assert res[i + 2]["param"] == "structured_outputs" and "\n" not in res[i + 2]["message"]
    json_obj = client.chat.completions.create(model=NAME, messages=MSG, response_format={"type": "json_object"},
                                              max_tokens=40, temperature=0)
    if json_obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(json_obj.choices[0].message.content), dict)
    s = llm.engine.scheduler                       # every page back (cached ones count as free)
    assert s.allocator.num_free == s.allocator.num_pages


@pytest.mark.parametrize("rf,needle", [
    ({"type": "xml"}, "response_format: type must be"),
    ({"type": "json_schema"}, "response_format: json_schema: expected"),
    ({"type": "json_schema", "json_schema": {"name": "bad name!", "schema": SCHEMA}}, "json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object",
      "properties": {"a": {"type": "nope"}}}}}, "response_format: json_schema.schema: "),
])
def test_bad_response_format(client, rf, needle):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=MSG, response_format=rf, max_tokens=4)
    assert e.value.body["param"] == "response_format" and needle in e.value.body["message"]
    assert "\n" not in e.value.body["message"]


def test_bad_structured_outputs(client):
    for so, needle in (({"regex": "a", "choice": ["b"]}, "exactly one"), ({"jsn": {}}, "unknown field"),
                       ("abc", "valid dictionary")):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model=NAME, prompt="x", max_tokens=4, extra_body={"structured_outputs": so})
        assert e.value.body["param"] == "structured_outputs" and needle in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=MSG, max_tokens=4, response_format={"type": "json_object"},
                                       extra_body={"structured_outputs": {"regex": "a"}})
    assert e.value.body["param"] == "structured_outputs"
