"""`graphrt serve` against slow and greedy clients (graphrt/serve/server.py, limits.py, bridge.py), on
CPU with a live server on 127.0.0.1 and raw sockets: trickled headers and bodies get 408 at their
deadline, a declared oversize Content-Length 413 before any body byte, connections past the bound
503 at once (the open ones unharmed), /health answers while a large request is parsed, stop lists
past the bound 400 naming `stop`, chat streams carry no empty content delta, and SIGTERM ends
in-flight streams with an error event and exits within the shutdown deadline."""
from __future__ import annotations

import http.client
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _checkpoints import write
from _serve_live import LiveServer, health_waits_while

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("transformers")

from graphrt import LLM  # noqa: E402
from graphrt.engine.params import MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS  # noqa: E402
from graphrt.serve import ServeConfig, create_app  # noqa: E402

NAME = "m"
BIG = 8 * 2**20
HEADER_S, BODY_S, MAX_CONN = 2.0, 2.0, 6
CPU = dict(device="cpu", backend="reference", max_batch=4, steps_per_graph=2, max_model_len=64)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write(tmp_path_factory, "guards", arch="llama", dtype="float32", seed=8)


@pytest.fixture(scope="module")
def llm(ckpt):
    return LLM(ckpt, **CPU)


@pytest.fixture(scope="module")
def live(llm):
    cfg = ServeConfig(served_model_name=NAME, max_request_bytes=BIG, header_timeout_s=HEADER_S,
                      body_timeout_s=BODY_S, max_connections=MAX_CONN)
    with LiveServer(create_app(llm, cfg)) as srv:
        yield srv


def post(live, path, body, *, timeout=60):
    conn = http.client.HTTPConnection("127.0.0.1", live.port, timeout=timeout)
    conn.request("POST", path, body if isinstance(body, bytes) else json.dumps(body).encode(),
                 {"Content-Type": "application/json"})
    r = conn.getresponse()
    out = r.status, r.read()
    conn.close()
    return out


def read_response(sock: socket.socket, timeout_s: float) -> tuple[int, dict, bytes, bool]:
    """Read until the peer closes or timeout_s -> (status, headers, body, closed)."""
    data, deadline, closed = b"", time.monotonic() + timeout_s, False
    while time.monotonic() < deadline:
        ready, _, _ = select.select([sock], [], [], max(deadline - time.monotonic(), 0))
        if not ready:
            break
        chunk = sock.recv(65536)
        if not chunk:
            closed = True
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1]) if lines[0].startswith("HTTP/") else 0
    headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
    return status, headers, body, closed


def openai_error(body: bytes, status: int) -> dict:
    e = json.loads(body)["error"]
    assert e["code"] == status and e["message"], e
    return e


def trickle(sock: socket.socket, data: bytes, every_s: float, limit_s: float) -> float:
    """Send `data` one byte every `every_s` until the server answers or closes; -> seconds taken."""
    t0 = time.monotonic()
    for b in data:
        try:
            sock.sendall(bytes([b]))
        except OSError:                                 # closed by the server
            break
        ready, _, _ = select.select([sock], [], [], every_s)
        if ready or time.monotonic() - t0 > limit_s:
            break
    return time.monotonic() - t0


def pages_full(llm) -> bool:
    a = llm.engine.scheduler.allocator
    return a.num_free == a.num_pages


REQUEST_HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"


def test_trickled_headers_get_408_at_the_header_deadline(live):
    sock = socket.create_connection(("127.0.0.1", live.port), timeout=30)
    took = trickle(sock, REQUEST_HEAD + b"X-Slow: " + b"a" * 100, every_s=0.7, limit_s=HEADER_S + 20)
    status, headers, body, closed = read_response(sock, 5)
    sock.close()
    assert status == 408 and headers.get("connection") == "close" and closed, (status, body)
    assert "header_timeout_s" in openai_error(body, 408)["message"]
    assert took < HEADER_S + 5, took
    # a kept-alive connection: the next request's headers trickled after a served one
    sock = socket.create_connection(("127.0.0.1", live.port), timeout=30)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert read_response(sock, 1.0)[0] == 200
    took = trickle(sock, REQUEST_HEAD + b"X-Slow: " + b"a" * 100, every_s=0.7, limit_s=HEADER_S + 20)
    status, _, body, closed = read_response(sock, 5)
    sock.close()
    assert status == 408 and closed and took < HEADER_S + 5, (status, body, took)


def test_trickled_body_gets_408_at_the_body_deadline(live, llm):
    body = json.dumps({"model": NAME, "prompt": "Hello", "max_tokens": 2}).encode().ljust(300)
    sock = socket.create_connection(("127.0.0.1", live.port), timeout=30)
    sock.sendall(REQUEST_HEAD + f"Content-Length: {len(body)}\r\n\r\n".encode())
    took = trickle(sock, body, every_s=0.7, limit_s=BODY_S + 20)
    status, headers, resp, closed = read_response(sock, 5)
    sock.close()
    assert status == 408 and headers.get("connection") == "close" and closed, (status, resp)
    assert "--body-timeout" in openai_error(resp, 408)["message"]
    assert took < BODY_S + 5, took
    assert pages_full(llm) and llm.engine.error is None


def test_declared_oversize_content_length_is_413_before_any_body_byte(live):
    sock = socket.create_connection(("127.0.0.1", live.port), timeout=30)
    sock.sendall(REQUEST_HEAD + f"Content-Length: {BIG + 1}\r\n\r\n".encode())   # headers only
    t0 = time.monotonic()
    status, headers, body, closed = read_response(sock, BODY_S / 2)       # well before the body deadline
    sock.close()
    assert status == 413 and closed, (status, body)
    assert f"{BIG + 1} bytes exceeds" in openai_error(body, 413)["message"]
    assert time.monotonic() - t0 < BODY_S / 2


def _wait_idle(live, timeout_s=10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while live.server.server_state.connections and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not live.server.server_state.connections, "connections of earlier tests are still open"


def test_connections_past_the_bound_are_refused_at_once_open_ones_unharmed(live):
    _wait_idle(live)
    open_conns = []
    for _ in range(MAX_CONN):                            # kept alive after one request each
        c = http.client.HTTPConnection("127.0.0.1", live.port, timeout=30)
        c.request("GET", "/health")
        r = c.getresponse()
        assert r.status == 200 and r.read()
        open_conns.append(c)
    extra = socket.create_connection(("127.0.0.1", live.port), timeout=30)
    status, headers, body, closed = read_response(extra, 3)    # before sending anything
    extra.close()
    assert status == 503 and closed, (status, body)
    assert "max_connections" in openai_error(body, 503)["message"]
    for c in open_conns:                                 # the open ones still serve
        c.request("GET", "/health")
        r = c.getresponse()
        assert r.status == 200 and json.loads(r.read()) == {"status": "ok"}
        c.close()
    _wait_idle(live)
    assert post(live, "/v1/completions", {"model": NAME, "prompt": "Hi", "max_tokens": 2})[0] == 200


def test_health_answers_while_a_large_request_is_parsed(live, llm, monkeypatch):
    """A 3 MB body (a long `user` string, a short prompt, every token id a stop id). Its JSON parse
    and the engine's add_request (the ids' scans) are made slow (1 s each, for this body only) so that
    the test does not depend on this machine's speed: on the event loop they would stall /health
    for seconds; on the worker pool /health, polled meanwhile, answers at once. (A prompt of ids
    past max_model_len is refused on its count before add_request: test_serve_bounds.py.)"""
    vocab = llm.engine.vocab_size
    ids = [i % vocab for i in range(MAX_STOP_TOKEN_IDS)]
    body = json.dumps({"model": NAME, "prompt": ids[:8], "stop_token_ids": ids, "user": "u" * 3_000_000,
                       "max_tokens": 2}).encode()
    assert len(body) < BIG
    loads, add = json.loads, llm.engine.add_request

    def slow_loads(s, *a, **k):
        if len(s) > 2**20:
            time.sleep(1.0)
        return loads(s, *a, **k)

    def slow_add(prompt, params, *a, **k):
        if len(params.stop_token_ids) == MAX_STOP_TOKEN_IDS:
            time.sleep(1.0)
        return add(prompt, params, *a, **k)
    monkeypatch.setattr(json, "loads", slow_loads)
    monkeypatch.setattr(llm.engine, "add_request", slow_add)
    took = []                                   # filled only once each answer is seen

    def big():
        for _ in range(2):
            t0 = time.monotonic()
            status, resp = post(live, "/v1/completions", body)
            assert status == 200 and b'"finish_reason":"stop"' in resp, resp[:300]    # every id stops it
            took.append(time.monotonic() - t0)
    waits = health_waits_while(live, big, pause=0.01)
    assert len(took) == 2 and min(took) >= 2.0, took       # both slow parts ran
    assert max(waits) < 0.5, (max(waits), took)             # never the 1 s of either


def test_stop_lists_past_the_bound_are_400_naming_stop(live, llm):
    base = {"model": NAME, "prompt": "Hello", "max_tokens": 6, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    status, body = post(live, "/v1/completions", base | {"stop": [f"s{i}" for i in range(300_000)]})
    assert status == 400 and openai_error(body, 400)["param"] == "stop", body[:300]
    status, body = post(live, "/v1/completions", base | {"stop": ["q" * 9000, "r" * 9000]})
    assert status == 400 and openai_error(body, 400)["param"] == "stop", body[:300]
    want = json.loads(post(live, "/v1/completions", base)[1])["choices"][0]
    many = [f"@@{i}@@" for i in range(MAX_STOP_STRINGS)]            # at the bound: served, none match
    status, body = post(live, "/v1/completions", base | {"stop": many})
    assert status == 200 and json.loads(body)["choices"][0]["token_ids"] == want["token_ids"], body
    stop_at = want["text"][2:4]                                    # one that matches: cut as before
    if stop_at:
        status, body = post(live, "/v1/completions", base | {"stop": many[1:] + [stop_at]})
        got = json.loads(body)["choices"][0]
        assert got["text"] == want["text"][:want["text"].find(stop_at)] and got["finish_reason"] == "stop"
    assert pages_full(llm)


def test_chat_stream_has_no_empty_content_delta(live):
    req = {"model": NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, "temperature": 0,
           "ignore_eos": True, "stop": ["@@@@@@@@"]}          # a long stop string: text is held back
    status, body = post(live, "/v1/chat/completions", req | {"stream": True})
    assert status == 200
    events = [json.loads(line[6:]) for line in body.decode().splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    deltas = [e["choices"][0]["delta"] for e in events]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert all(d.get("content") for d in deltas[1:-1]), deltas      # every middle delta carries text
    assert deltas[-1] == {} and events[-1]["choices"][0]["finish_reason"] == "length"
    whole = json.loads(post(live, "/v1/chat/completions", req)[1])["choices"][0]["message"]["content"]
    assert "".join(d.get("content", "") for d in deltas) == whole


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_sigterm_ends_streams_with_an_error_event_and_exits_within_the_deadline(ckpt, tmp_path):
    """The real `graphrt serve`: one stream in flight, one client trickling its body, one trickling
    its headers; SIGTERM: the stream gets an error event and [DONE], the process exits 0 within
    --shutdown-timeout (+ start-up of the exit path), not waiting for the slow clients."""
    port, shutdown_s = _free_port(), 3.0
    yaml = tmp_path / "serve.yaml"
    yaml.write_text("max_batch: 2\nsteps_per_graph: 1\nmax_model_len: 256\nbackend: reference\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "graphrt.cli", "serve", "--model", str(ckpt), "--device",
                                 "cpu", "--config", str(yaml), "--served-model-name", NAME, "--port", str(port),
                                 "--shutdown-timeout", str(shutdown_s), "--body-timeout", "600",
                                 "--header-timeout", "600", "--log-level", "info"],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.3)
        stream = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        stream.request("POST", "/v1/completions", json.dumps({
            "model": NAME, "prompt": "Hello", "max_tokens": 240, "stream": True, "ignore_eos": True}),
            {"Content-Type": "application/json"})
        r = stream.getresponse()
        assert r.status == 200
        first = r.read1(65536)
        assert first.startswith(b"data: ")
        slow_body = socket.create_connection(("127.0.0.1", port), timeout=30)
        slow_body.sendall(REQUEST_HEAD + b"Content-Length: 1000\r\n\r\n{")
        slow_head = socket.create_connection(("127.0.0.1", port), timeout=30)
        slow_head.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        time.sleep(0.5)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rest = first
        while True:                                       # the stream ends, with an error event
            chunk = r.read1(65536)
            if not chunk:
                break
            rest += chunk
        events = [line[6:] for line in rest.decode().splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]", events[-3:]
        err = json.loads(events[-2])["error"]
        assert err["code"] == 503 and "shutting down" in err["message"], err
        code = proc.wait(timeout=shutdown_s + 15)
        took = time.monotonic() - t0
        assert code in (0, -signal.SIGTERM), log.read_text()[-3000:]   # uvicorn re-raises the signal
        assert took < shutdown_s + 8, (took, log.read_text()[-2000:])
        slow_body.close()
        slow_head.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
