"""`graphrt serve` (graphrt/serve/) on CPU: a live uvicorn server on 127.0.0.1 over a tiny random
checkpoint written by the test, queried with the official `openai` client. Greedy outputs are
compared with HF transformers `generate` on the same files; disconnects must free the engine's
pages; bad requests must be 400 with an OpenAI error body naming the field; /metrics must be
valid Prometheus text whose counters move by what was served."""
from __future__ import annotations

import http.client
import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import torch

from _checkpoints import write
from _serve_live import LiveServer, get_metrics, pages_full, wait_for

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
transformers = pytest.importorskip("transformers")

from graphrt import LLM, SamplingParams  # noqa: E402
from graphrt.serve import ServeConfig, create_app  # noqa: E402

NAME = "tiny-llama"
GREEDY = dict(temperature=0.0, extra_body={"ignore_eos": True, "return_token_ids": True})


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write(tmp_path_factory, "serve", arch="llama", dtype="float32", seed=3)


@pytest.fixture(scope="module")
def llm(ckpt):
    return LLM(ckpt, device="cpu", max_batch=4, steps_per_graph=2, max_model_len=96)


@pytest.fixture(scope="module")
def live(llm):
    with LiveServer(create_app(llm, ServeConfig(served_model_name=NAME, max_waiting=8))) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(live):
    return live.client()


@pytest.fixture(scope="module")
def hf(ckpt):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None       # the requests run with ignore_eos
    return model


def hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(ids):].tolist()


def hf_text(llm, hf, ids, n) -> str:
    return llm.tokenizer.decode(hf_greedy(hf, ids, n), skip_special_tokens=True)


# ---- generation --------------------------------------------------------------------------------
def test_models_and_health(live, client):
    assert [m.id for m in client.models.list().data] == [NAME]
    assert client.models.retrieve(NAME).id == NAME
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("other")
    assert e.value.body["param"] == "model" and "not served here" in e.value.body["message"]
    conn = http.client.HTTPConnection("127.0.0.1", live.port, timeout=10)
    conn.request("GET", "/health")
    r = conn.getresponse()
    assert r.status == 200 and json.loads(r.read()) == {"status": "ok"}


def test_completion_greedy_equals_hf_streaming_and_not(llm, hf, client):
    prompt = "Hello world"
    ids = llm.tokenizer(prompt).input_ids
    want_ids = hf_greedy(hf, ids, 6)
    want = llm.tokenizer.decode(want_ids, skip_special_tokens=True)
    r = client.completions.create(model=NAME, prompt=prompt, max_tokens=6, **GREEDY)
    assert r.choices[0].token_ids == want_ids
    assert r.choices[0].text == want and r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (len(ids), 6, len(ids) + 6)
    chunks = list(client.completions.create(model=NAME, prompt=ids, max_tokens=6, stream=True,
                                            stream_options={"include_usage": True}, **GREEDY))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == want and sum((c.choices[0].token_ids for c in chunks if c.choices), []) == want_ids
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert wait_for(lambda: pages_full(llm))


def test_chat_greedy_equals_hf_streaming_and_not(llm, hf, client):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the graph token"}]
    ids = llm.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    ids = llm.tokenizer(ids).input_ids
    want_ids = hf_greedy(hf, ids, 5)
    want = llm.tokenizer.decode(want_ids, skip_special_tokens=True)
    r = client.chat.completions.create(model=NAME, messages=msgs, max_tokens=5, **GREEDY)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == want
    assert r.choices[0].token_ids == want_ids
    assert r.choices[0].finish_reason == "length" and r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens == 5
    chunks = list(client.chat.completions.create(model=NAME, messages=msgs, max_completion_tokens=5,
                                                 stream=True, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "length"


SAMPLED = dict(temperature=0.8, seed=5, extra_body={"ignore_eos": True, "return_token_ids": True})


def _streamed(chunks) -> dict:
    """choice index -> (its text, token ids, finish reasons) joined over a stream's chunks."""
    got: dict = {}
    for c in chunks:
        for ch in c.choices:
            text, ids, why = got.get(ch.index, ("", [], []))
            delta = ch.text if hasattr(ch, "text") else (ch.delta.content or "")
            ids = ids + (getattr(ch, "token_ids", None) or [])       # a role chunk has none
            got[ch.index] = (text + delta, ids, why + [ch.finish_reason] * bool(ch.finish_reason))
    return got


def test_completion_n_and_several_prompts_choices_prompt_major(llm, client):
    prompts, seed = ["Hello", "the graph"], SAMPLED["seed"]
    r = client.completions.create(model=NAME, prompt=prompts, n=2, max_tokens=3, **SAMPLED)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    want = [o.token_ids for p in prompts for o in llm.generate(
        [p], SamplingParams(n=2, seed=seed, temperature=0.8, max_tokens=3, ignore_eos=True), use_tqdm=False)[0].outputs]
    assert [c.token_ids for c in r.choices] == want and len({tuple(w) for w in want}) > 1
    assert r.usage.completion_tokens == 12
    assert r.usage.prompt_tokens == sum(len(llm.tokenizer(p).input_ids) for p in prompts)
    got = _streamed(client.completions.create(model=NAME, prompt=prompts, n=2, max_tokens=3, stream=True, **SAMPLED))
    assert {i: (t, ids, why) for i, (t, ids, why) in got.items()} == {
        c.index: (c.text, c.token_ids, ["length"]) for c in r.choices}
    assert wait_for(lambda: pages_full(llm))


def test_chat_n_choices_streaming_and_not(llm, client):
    msgs = [{"role": "user", "content": "the graph token"}]
    r = client.chat.completions.create(model=NAME, messages=msgs, n=2, max_tokens=3, **SAMPLED)
    assert [c.index for c in r.choices] == [0, 1] and r.choices[0].token_ids != r.choices[1].token_ids
    chunks = list(client.chat.completions.create(model=NAME, messages=msgs, n=2, max_tokens=3, stream=True, **SAMPLED))
    assert [(c.choices[0].index, c.choices[0].delta.role) for c in chunks[:2]] == [(0, "assistant"), (1, "assistant")]
    got = _streamed(chunks)
    assert {i: (ids, why) for i, (_, ids, why) in got.items()} == {
        c.index: (c.token_ids, ["length"]) for c in r.choices}
    assert [got[c.index][0] for c in r.choices] == [c.message.content for c in r.choices]
    assert wait_for(lambda: pages_full(llm))


def test_stop_string_and_max_tokens(llm, hf, client):
    prompt = "the graph"
    full = client.completions.create(model=NAME, prompt=prompt, max_tokens=12, **GREEDY).choices[0].text
    assert full == hf_text(llm, hf, llm.tokenizer(prompt).input_ids, 12)
    m = re.search(r"[A-Za-z]", full[1:])
    assert m, f"no letter to stop at in {full!r}"
    stop = m.group(0)
    cut = full.index(stop)
    r = client.completions.create(model=NAME, prompt=prompt, max_tokens=12, stop=[stop, "\u2603never"], **GREEDY)
    assert r.choices[0].text == full[:cut] and r.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(model=NAME, prompt=prompt, max_tokens=12, stop=stop, stream=True,
                                            **GREEDY))
    assert "".join(c.choices[0].text for c in chunks) == full[:cut]
    assert chunks[-1].choices[0].finish_reason == "stop"
    r = client.completions.create(model=NAME, prompt=prompt, max_tokens=3, temperature=0.0,
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"
    assert full.startswith(r.choices[0].text)
    assert "token_ids" not in r.choices[0].model_dump()      # only with return_token_ids


def test_four_concurrent_clients_get_their_own_tokens(llm, hf, live):
    prompts = [[5, 6, 7], list(range(10, 40)), "Hello world the graph", [42] * 11]
    n = [7, 5, 8, 6]

    def run(i):
        c = live.client()                              # one connection per client
        stream = c.completions.create(model=NAME, prompt=prompts[i], max_tokens=n[i], stream=True, **GREEDY)
        chunks = list(stream)
        return "".join(ch.choices[0].text for ch in chunks), sum((ch.choices[0].token_ids for ch in chunks), [])

    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(run, range(4)))
    for p, k, (text, ids_out) in zip(prompts, n, got):
        ids = p if isinstance(p, list) else llm.tokenizer(p).input_ids
        want = hf_greedy(hf, ids, k)
        assert ids_out == want and text == llm.tokenizer.decode(want, skip_special_tokens=True)
    assert wait_for(lambda: pages_full(llm))


def test_disconnect_mid_stream_aborts_and_frees_pages(llm, live, client):
    metrics = live.server.config.app.state.metrics
    aborted = metrics.finished["abort"]
    stream = client.completions.create(model=NAME, prompt="Hello", max_tokens=80, stream=True, **GREEDY)
    first = next(iter(stream))
    assert first.choices[0].finish_reason is None
    assert not pages_full(llm)                           # the request holds pages while it runs
    stream.close()                                       # the client goes away
    assert wait_for(lambda: pages_full(llm)), "pages not returned after the client disconnected"
    assert wait_for(lambda: metrics.finished["abort"] == aborted + 1)
    assert live.server.config.app.state.bridge.in_flight == 0


def test_non_streaming_disconnect_aborts(llm, live):
    metrics = live.server.config.app.state.metrics
    aborted = metrics.finished["abort"]
    conn = http.client.HTTPConnection("127.0.0.1", live.port, timeout=10)
    body = json.dumps({"model": NAME, "prompt": "Hello", "max_tokens": 80, "temperature": 0, "ignore_eos": True})
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    assert wait_for(lambda: not pages_full(llm), timeout=10)
    conn.close()
    assert wait_for(lambda: pages_full(llm)) and wait_for(lambda: metrics.finished["abort"] == aborted + 1)


# ---- errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,param,text", [
    (dict(model="nope"), "model", "not served here"),
    (dict(prompt=[5] * 90, max_tokens=16), "max_tokens", "exceed max_model_len 96"),
    (dict(prompt=[5] * 96, max_tokens=1), "prompt", "max_model_len 96"),
    (dict(temperature=-1.0), "temperature", "must be >= 0"),
    (dict(top_p=1.5), "top_p", "(0, 1]"),
    (dict(max_tokens=0), "max_tokens", "max_tokens"),
    (dict(n=0), "n", "must be in [1, 128]"),
    (dict(logprobs=21), "logprobs", "[0, 20]"),
    (dict(prompt=["a", ""]), "prompt", "prompt[1]: empty"),
    (dict(prompt=[1, 10**6]), "prompt", "outside the vocabulary"),
    (dict(extra_body={"frobnicate": 1}), "frobnicate", "unsupported field"),
    (dict(extra_body={"top_k": -5}), "top_k", "top_k"),
    (dict(stop=[""]), "stop", "stop"),
])
def test_bad_completion_requests_are_400_naming_the_field(client, kwargs, param, text):
    args = dict(model=NAME, prompt="Hello", max_tokens=4) | kwargs
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(**args)
    err = e.value.body
    assert e.value.status_code == 400 and err["code"] == 400 and err["type"] == "invalid_request_error"
    assert err["param"] == param and text in err["message"], err


@pytest.mark.parametrize("kwargs,param,text", [
    (dict(messages=[]), "messages", "at least 1"),
    (dict(messages=[{"role": "wizard", "content": "x"}]), "messages", "messages.0.role"),
    (dict(messages=[{"role": "user", "content": "x " * 120}]), "messages", "max_model_len"),
    (dict(tools=[{"type": "code"}]), "tools", "tools[0]"),
    (dict(presence_penalty=2.5), "presence_penalty", "[-2, 2]"),
])
def test_bad_chat_requests_are_400(client, kwargs, param, text):
    args = dict(model=NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=4) | kwargs
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**args)
    assert e.value.body["param"] == param and text in e.value.body["message"], e.value.body


def test_malformed_json_and_unknown_route(live):
    conn = http.client.HTTPConnection("127.0.0.1", live.port, timeout=10)
    conn.request("POST", "/v1/completions", '{"model": "tiny-llama", "prompt": ', {"Content-Type": "application/json"})
    r = conn.getresponse()
    body = json.loads(r.read())
    assert r.status == 400 and "malformed JSON" in body["error"]["message"] and body["error"]["code"] == 400
    conn.request("GET", "/v1/nothing")
    r = conn.getresponse()
    assert r.status == 404 and json.loads(r.read())["error"]["code"] == 404


class _GatedEngine:
    """The real engine, but each stream's deltas are held until `gate` opens (so requests stay
    in flight as long as the test needs)."""

    def __init__(self, engine, gate: threading.Event):
        self.engine, self.gate = engine, gate

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def add_request(self, prompt, params, *, request_id):
        stream = self.engine.add_request(prompt, params, request_id=request_id)
        gate = self.gate

        class Held:
            def __iter__(self):
                gate.wait()
                yield from stream
        return Held()


def test_queue_full_is_503_then_recovers(llm, hf):
    gate = threading.Event()
    fake_llm = SimpleNamespace(engine=_GatedEngine(llm.engine, gate), tokenizer=llm.tokenizer,
                               config=SimpleNamespace(max_batch=1), checkpoint=llm.checkpoint)
    app = create_app(fake_llm, ServeConfig(served_model_name=NAME, max_waiting=1))   # capacity 2
    with LiveServer(app) as srv:
        c = srv.client()
        held = [c.completions.create(model=NAME, prompt=[7, 8, 9], max_tokens=4, stream=True, **GREEDY)
                for _ in range(2)]
        with pytest.raises(openai.InternalServerError) as e:
            c.completions.create(model=NAME, prompt="Hello", max_tokens=4)
        assert e.value.status_code == 503 and "queue full" in e.value.body["message"]
        assert e.value.body["code"] == 503
        gate.set()
        want = hf_text(llm, hf, [7, 8, 9], 4)
        assert ["".join(ch.choices[0].text for ch in s) for s in held] == [want, want]
        assert c.completions.create(model=NAME, prompt=[7, 8, 9], max_tokens=4, **GREEDY).choices[0].text == want
        assert app.state.metrics.rejected == 1
    assert wait_for(lambda: pages_full(llm))


# ---- metrics -----------------------------------------------------------------------------------
def test_metrics_parse_and_count_what_was_served(llm, live, client):
    before = get_metrics(live)
    r = client.completions.create(model=NAME, prompt=[3, 4, 5, 6], max_tokens=3, **GREEDY)
    assert r.usage.completion_tokens == 3
    assert wait_for(lambda: pages_full(llm))            # the engine frees pages just after the last delta
    after = get_metrics(live)
    assert after["graphrt_generation_tokens_total"] - before["graphrt_generation_tokens_total"] == 3
    assert after["graphrt_prompt_tokens_total"] - before["graphrt_prompt_tokens_total"] == 4
    assert after['graphrt_requests_finished_total{finish_reason="length"}'] - \
        before['graphrt_requests_finished_total{finish_reason="length"}'] == 1
    tpot = "graphrt_time_per_output_token_seconds"
    assert after[f"{tpot}_count"] == before[f"{tpot}_count"] + 1
    assert after[f"{tpot}_count"] == after[f'{tpot}_bucket{{le="+Inf"}}']
    buckets = [v for k, v in after.items() if k.startswith(f"{tpot}_bucket")]
    assert buckets == sorted(buckets)                     # cumulative
    a = llm.engine.scheduler.allocator
    assert after["graphrt_kv_pages_free"] == a.num_pages and after["graphrt_kv_pages_used"] == 0
    assert after["graphrt_requests_running"] == 0 and after["graphrt_requests_waiting"] == 0


def test_sse_response_closes_its_request_even_if_the_body_never_started():
    """A client gone before the first event: the event generator never runs, on_close still does."""
    import asyncio

    from starlette.requests import ClientDisconnect

    from graphrt.serve.completions import SSEResponse
    started, closed = [], []

    async def events():
        started.append(1)
        yield "data: x\n\n"

    async def receive():
        return {"type": "http.disconnect"}

    async def send(message):
        raise OSError("client gone")

    resp = SSEResponse(events(), on_close=lambda: closed.append(1))
    scope = {"type": "http", "asgi": {"spec_version": "2.4"}}
    with pytest.raises(ClientDisconnect):
        asyncio.run(resp(scope, receive, send))
    assert closed == [1] and started == []
