"""`graphrt serve`'s bounds on what one request may take, on CPU with a live server on 127.0.0.1
(graphrt/serve/bridge.py, completions.py, errors.py, protocol.py): admission counts engine
sequences (prompts x n), so an 80-prompt x n=128 request is refused naming `n` and the limit
before anything is queued, and one that does not fit beside the running ones is a 503; every
request value an error quotes is clipped (the body and the log line stay small for a 3 MB model
name or logit_bias key); errors name the field the client sent (chat's top_logprobs); a 4 MB
text prompt leaves /health answering while it is tokenized, and a running stream's gaps between
chunks within twice their normal (it is tokenized in a separate process, which returns only its
token count: serve/tokenizer_process.py)."""
from __future__ import annotations

import gc
import http.client
import json
import logging
import statistics
import threading
import time

import pytest

from _checkpoints import write
from _serve_live import LiveServer, health_waits_while, wait_for

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("transformers")

from graphrt import LLM  # noqa: E402
from graphrt.serve import ServeConfig, create_app  # noqa: E402
ECHO_CHARS, MESSAGE_CHARS = 200, 2000                 # graphrt.serve.errors: a quoted value, a message

NAME = "m"
MAX_BATCH, MAX_WAITING = 4, 100                 # 104 sequences: 80 prompts fit, 80 x 128 samples do not
LONG = 1024                                     # long_live's context: a stream of ~12 s on 2 cores
BIG_PROMPT = "Hello there, general graph runtime. " * (4_000_000 // 36)      # 4 MB, ~3.2M ids: seconds
CPU = dict(device="cpu", backend="reference", max_batch=MAX_BATCH, steps_per_graph=2, max_model_len=64)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return LLM(write(tmp_path_factory, "bounds", arch="llama", dtype="float32", seed=8), **CPU)


@pytest.fixture(scope="module")
def live(llm):
    with LiveServer(create_app(llm, ServeConfig(served_model_name=NAME, max_waiting=MAX_WAITING))) as srv:
        yield srv


@pytest.fixture(scope="module")
def long_live(tmp_path_factory):
    """A server whose stream outlasts a 4 MB prompt's tokenization: the tiny checkpoint's context
    raised to LONG positions (its config.json edited), a stream of ~LONG / 2 chunks (2 tokens a step)."""
    path = write(tmp_path_factory, "gaps", arch="llama", dtype="float32", seed=8)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(cfg | {"max_position_embeddings": LONG}))
    llm = LLM(path, **(CPU | dict(max_model_len=LONG)))
    with LiveServer(create_app(llm, ServeConfig(served_model_name=NAME, max_waiting=MAX_WAITING))) as srv:
        yield srv


def post(live, path, body, *, timeout=60) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", live.port, timeout=timeout)
    conn.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    r = conn.getresponse()
    out = r.status, r.read()
    conn.close()
    return out


def error(resp, status: int, param) -> str:
    code, body = resp
    assert code == status, (code, body[:500])
    e = json.loads(body)["error"]
    assert e["code"] == status and e["param"] == param, e
    return e["message"]


def bridge(live):
    return live.server.config.app.state.bridge


def test_sequences_not_requests_are_admitted(live, llm):
    added, add = [], llm.engine.add_request
    llm.engine.add_request = lambda *a, **k: added.append(1) or add(*a, **k)
    try:
        body = {"model": NAME, "prompt": [[1, 2, 3]] * 80, "n": 128, "max_tokens": 1, "temperature": 1.0}
        msg = error(post(live, "/v1/completions", body, timeout=30), 400, "n")
        assert "10240 sequences" in msg and f"max_batch + max_waiting = {MAX_BATCH + MAX_WAITING}" in msg, msg
        body.update(n=1, best_of=2)
        assert "160 sequences" in error(post(live, "/v1/completions", body, timeout=30), 400, "best_of")
        chat = {"model": NAME, "messages": [{"role": "user", "content": "Hi"}], "n": 105, "max_tokens": 1}
        assert "105 sequences" in error(post(live, "/v1/chat/completions", chat, timeout=30), 400, "n")
        assert added == [] and bridge(live).in_flight == 0          # nothing reached the engine
    finally:
        llm.engine.add_request = add
    # 60 sequences in flight (a stream held open): 50 more do not fit now (503), 40 do
    conn = http.client.HTTPConnection("127.0.0.1", live.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({"model": NAME, "prompt": [1, 2, 3], "n": 60, "max_tokens": 8,
                                                        "stream": True, "temperature": 1.0}).encode(),
                 {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200 and r.readline().startswith(b"data: ")
    assert bridge(live).in_flight == 60
    msg = error(post(live, "/v1/completions", {"model": NAME, "prompt": [[1, 2]] * 10, "n": 5, "max_tokens": 1}), 503,
                None)
    assert "queue full" in msg and "60 sequences in flight" in msg, msg
    assert bridge(live).in_flight == 60
    long = {"model": NAME, "prompt": [[1, 2] * 40] * 4, "n": 10, "max_tokens": 1}    # refused on its count,
    llm.engine.add_request = lambda *a, **k: added.append(1) or add(*a, **k)         # before the engine scans it
    try:
        assert "80 tokens leave no room" in error(post(live, "/v1/completions", long), 400, "prompt")
    finally:
        llm.engine.add_request = add
    assert bridge(live).in_flight == 60 and added == []
    conn.close()                                                     # the stream's client goes: aborted
    deadline = time.monotonic() + 30
    while bridge(live).in_flight and time.monotonic() < deadline:
        time.sleep(0.05)
    assert bridge(live).in_flight == 0 and llm.engine.error is None


def test_echoed_values_are_clipped_in_the_body_and_the_log(live, caplog):
    huge = "x" * 3_000_000
    cases = [("/v1/completions", {"model": huge, "prompt": "Hi"}, "model"),
             ("/v1/completions", {"model": NAME, "prompt": "Hi", "logit_bias": {huge: 1.0}}, "logit_bias"),
             ("/v1/completions", {"model": NAME, "prompt": "Hi", "logit_bias": {huge: "a"}}, "logit_bias"),
             ("/v1/chat/completions", {"model": huge, "messages": [{"role": "user", "content": "Hi"}]}, "model"),
             ("/v1/completions", {"model": NAME, "prompt": "Hi", "structured_outputs": {huge: 1}}, "structured_outputs"),
             ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "Hi"}],
                                       "response_format": {"type": "text", huge: 1}}, "response_format"),
             ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "Hi"}],
                                       "response_format": {"type": huge}}, "response_format"),
             ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "Hi"}],
                                       "response_format": {"type": "json_schema", "json_schema": {huge: 1}}},
              "response_format")]
    with caplog.at_level(logging.INFO, logger="graphrt.serve"):
        for path, body, param in cases:
            code, raw = post(live, path, body)
            assert code == 400 and len(raw) < 2 * MESSAGE_CHARS, (code, len(raw))
            e = json.loads(raw)["error"]
            assert e["param"] == param and "clipped" in e["message"], e
            assert "x" * (ECHO_CHARS - 1) in e["message"] and "x" * (ECHO_CHARS + 1) not in e["message"]
        code, raw = post(live, "/v1/completions", {"model": NAME, "prompt": "Hi", "logit_bias": {"7" * 4000: 1.0}})
        e = json.loads(raw)["error"]                        # a token id of 4,000 digits (int() takes 4,300)
        assert code == 400 and e["param"] == "logit_bias" and len(e["message"]) < ECHO_CHARS, e
    lines = [r.getMessage() for r in caplog.records if r.name == "graphrt.serve"]
    assert len(lines) >= len(cases) and max(map(len, lines)) < 2 * MESSAGE_CHARS


def test_chat_errors_name_the_field_the_client_sent(live):
    base = {"model": NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    msg = error(post(live, "/v1/chat/completions", base | {"logprobs": True, "top_logprobs": 21}), 400,
                "top_logprobs")
    assert msg.startswith("top_logprobs:"), msg
    msg = error(post(live, "/v1/chat/completions", base | {"min_tokens": 1, "stop_token_ids": list(range(170))}), 400,
                "stop_token_ids")
    assert msg.startswith("stop_token_ids:"), msg


def test_health_answers_while_a_4mb_prompt_is_tokenized(live, llm):
    """The prompt is tokenized in the tokenizer process (then refused: longer than the context),
    so /health, polled meanwhile, never waits for it."""
    text = BIG_PROMPT
    took = []                                   # filled only once the 400 is seen

    def big():
        t0 = time.monotonic()
        code, raw = post(live, "/v1/completions", {"model": NAME, "prompt": text, "max_tokens": 1}, timeout=120)
        assert code == 400 and b"max_model_len" in raw, raw[:300]
        took.append(time.monotonic() - t0)
    waits = health_waits_while(live, big)
    assert took and len(waits) > 10, (took, len(waits))
    # holding the GIL, the tokenizer stalled /health for its whole run (seconds); released, a wait
    # is short: 0.5 s, or a fifth of the request where a loaded machine stretches everything
    assert max(waits) < max(0.5, 0.2 * took[0]), (max(waits), took)


HOSTILE = [    # bodies of about 4 MB (the default limit) whose every item was one validation error
    ("/v1/completions", {"prompt": "Hi", "stop_token_ids": ["x"] * 800_000}, "stop_token_ids"),
    ("/v1/completions", {"prompt": "Hi", "stop": [7] * 800_000}, "stop"),
    ("/v1/completions", {"prompt": "Hi", "logit_bias": {str(i): "a" for i in range(250_000)}}, "logit_bias"),
    ("/v1/completions", {"prompt": [[1]] * 10 + [["x"]] * 500_000}, "prompt"),
    ("/v1/completions", {"prompt": "Hi"} | {f"k{i}": 1 for i in range(300_000)}, "k0"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}] * 200_000}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"} | {f"k{i}": 1 for i in range(300_000)}]},
     "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}] * 140_000}]},
     "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "tools": [{}] * 1_000_000}, "tools"),
]


def test_a_body_of_errors_is_refused_at_its_first(live):
    """pydantic builds each validation error's Python objects holding the GIL: 800k bad items (4 MB)
    stalled every thread of the server 1.6 s. Lists the engine caps are refused on their length,
    others stop at their first bad item, an object's unknown fields past the first few are dropped:
    a few errors per body, a 400 naming the field, and /health answers meanwhile. The last body
    (500k one-token prompts, counted before they are validated) makes half a million lists: the
    collector's full passes over them and the start-up heap stalled /health 0.5-0.8 s in this test
    process, unless the start-up heap is frozen (app.py)."""
    from fastapi.exceptions import RequestValidationError
    from graphrt.serve.completions import parse_body
    from graphrt.serve.protocol import ChatCompletionRequest, CompletionRequest
    bodies = []
    for path, body, param in HOSTILE:
        raw = json.dumps({"model": NAME} | body).encode()
        assert len(raw) <= 4 * 2**20
        cls = CompletionRequest if path == "/v1/completions" else ChatCompletionRequest
        with pytest.raises(RequestValidationError) as e:
            parse_body(raw, cls, MAX_BATCH + MAX_WAITING)
        assert len(e.value.errors()) <= 8, (param, len(e.value.errors()))
        bodies.append((path, raw, param))
    bodies.append(("/v1/completions", json.dumps({"model": NAME, "prompt": [[1]] * 500_000}).encode(), "prompt"))
    seen = []

    def send():
        t0 = time.monotonic()
        for path, raw, param in bodies:
            conn = http.client.HTTPConnection("127.0.0.1", live.port, timeout=60)
            conn.request("POST", path, raw, {"Content-Type": "application/json"})
            r = conn.getresponse()
            seen.append(error((r.status, r.read()), 400, param))
            conn.close()
        seen.append(time.monotonic() - t0)
    waits = health_waits_while(live, send)
    assert len(seen) == len(bodies) + 1, seen
    assert "at most 104 prompts" in seen[-2], seen[-2]
    assert max(waits) < max(0.5, 0.2 * seen[-1]), (max(waits), seen[-1])


def test_health_answers_while_a_whole_response_is_built(live, monkeypatch):
    """A whole response's log-probs take seconds for n long choices (0.6 s a choice of 4,096
    tokens with top 20); made slow here (1 s each, so the test does not depend on this machine),
    on the event loop they stalled /health for their whole run; on the worker pool they do not."""
    import graphrt.serve.completions as completions
    for name in ("chat_logprobs", "completion_logprobs"):
        def slow(*a, _f=getattr(completions, name), **k):
            time.sleep(1.0)
            return _f(*a, **k)
        monkeypatch.setattr(completions, name, slow)
    got = []

    def ask():
        for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                    "logprobs": True, "top_logprobs": 2}),
                           ("/v1/completions", {"prompt": "Hi", "logprobs": 2})):
            t0 = time.monotonic()
            code, raw = post(live, path, {"model": NAME, "max_tokens": 2} | body)
            assert code == 200 and json.loads(raw)["choices"][0]["logprobs"], raw[:300]
            got.append(time.monotonic() - t0)
    waits = health_waits_while(live, ask)
    assert len(got) == 2 and min(got) >= 1.0, got
    assert max(waits) < 0.5, (max(waits), got)


def test_slow_grammars_hold_no_worker(live, llm, monkeypatch):
    """A request's grammar compiles on the engine's compile pool while the event loop waits for it.
    Waiting on the worker pool instead, requests with slow grammars (one more than its workers)
    held every worker for up to the compile timeout (10 s), and every other request's parsing and
    tokenization waited; here a plain request is answered while they are still compiling."""
    import threading
    from graphrt.engine.structured import Grammars
    release, compile_ = threading.Event(), Grammars._compile

    def slow(self, so):
        if so.key[1].startswith("slow"):
            release.wait(30)
        return compile_(self, so)
    monkeypatch.setattr(Grammars, "_compile", slow)
    got = []

    def constrained(i):
        got.append(post(live, "/v1/completions", {"model": NAME, "prompt": "Hi", "max_tokens": 2,
                                                  "structured_outputs": {"regex": f"slow{i}[a-z]*"}})[0])
    threads = [threading.Thread(target=constrained, args=(i,)) for i in range(bridge(live)._pool._max_workers + 1)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    code, raw = post(live, "/v1/completions", {"model": NAME, "prompt": "Hi", "max_tokens": 2})
    took = time.monotonic() - t0
    release.set()
    for t in threads:
        t.join(60)
    assert code == 200 and took < 5.0, (code, took, raw[:200])
    assert got == [200] * len(threads), got


def test_stream_gaps_stay_near_normal_while_a_4mb_prompt_is_tokenized(long_live):
    """One stream runs; after BASE chunks (its normal gap: their median) the 4 MB prompt is sent
    (tokenized in the tokenizer process, then refused: longer than the context). Every gap between
    the stream's chunks that overlaps that request stays within twice the normal (see the floor):
    a tokenizer holding the GIL stops the engine thread and the event loop for its whole run, and
    in the server even freeing the 3.2M-token encoding and copying its ids held it ~0.5 s."""
    BASE, AFTER = 40, 5                           # chunks before the big request, chunks after its reply
    body = json.dumps({"model": NAME, "prompt": BIG_PROMPT, "max_tokens": 1}).encode()   # encoded up front
    assert gc.get_freeze_count() > 0              # the app froze its start-up heap: no ~0.2 s full collections
    window = {}                                   # t0, t1: the big request's send and reply (monotonic s)

    def big():
        window["t0"] = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", long_live.port, timeout=120)
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        window["reply"] = r.status, r.read()
        window["t1"] = time.monotonic()
        conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", long_live.port, timeout=120)
    conn.request("POST", "/v1/completions", json.dumps({"model": NAME, "prompt": [1, 2, 3], "max_tokens": LONG - 8,
                                                        "ignore_eos": True, "stream": True}).encode(),
                 {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200
    chunks, sender = [], threading.Thread(target=big, daemon=True)     # chunks: arrival times (monotonic s)
    while line := r.readline():
        if not line.startswith(b"data: "):
            continue
        chunks.append(time.monotonic())
        if line.startswith(b"data: [DONE]"):
            break
        if len(chunks) == BASE:
            sender.start()
        if "t1" in window and sum(t > window["t1"] for t in chunks) >= AFTER:
            break
    conn.close()                                  # the stream's client goes: aborted
    assert len(chunks) > BASE, len(chunks)
    sender.join(120)
    assert window.get("reply", (None,))[0] == 400 and b"max_model_len" in window["reply"][1], window.get("reply")
    assert wait_for(lambda: bridge(long_live).in_flight == 0, timeout=30)
    t0, t1 = window["t0"], window["t1"]
    gaps = [(a, b - a) for a, b in zip(chunks, chunks[1:])]             # (start, length s)
    normal = statistics.median(g for a, g in gaps[2:BASE - 1])          # gaps[0:2]: the prefill, the first step
    during = [g for a, g in gaps if a < t1 and a + g > t0]
    # the stream ran before, through and after the request (not a stream that ended first)
    assert chunks[0] < t0 and chunks[-1] > t1 and during, (len(chunks), len(during), t1 - t0)
    # 2 x the median, or the median + 250 ms where that is more. The floor: a tokenizer that
    # releases the GIL still takes a core, and on 2 cores the engine's step then takes about twice
    # as long with jitter on top (seen: normal 23 ms, gaps up to ~100 ms), and a fast machine's
    # median of a few ms doubled is within a scheduler's or the collector's hiccup (a full
    # collection of the whole heap, ~0.2 s, is not: hence the frozen start-up heap). A tokenizer
    # holding the GIL stalls the stream for the whole encode (seconds), far past either, and the
    # in-server path that freed the 3.2M-token encoding stalled it ~0.5 s. 250 ms, not 100: on a
    # loaded 2-core machine (CI's, with another test beside) gaps of up to ~150 ms were seen.
    bound = max(2 * normal, normal + 0.25)
    assert max(during) <= bound, (f"normal {normal * 1e3:.1f} ms, max {max(during) * 1e3:.1f} ms over "
                                  f"{len(during)} gaps, request {t1 - t0:.2f} s")
