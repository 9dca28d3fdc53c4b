"""Test helpers: a live `graphrt serve` app (uvicorn) on 127.0.0.1, a free port, a background thread;
a Prometheus text-format checker; waiting for a condition; an engine whose pages are all free."""
from __future__ import annotations

import http.client
import re
import socket
import threading
import time


class LiveServer:
    """Runs `app` (create_app's) as `graphrt serve` does (graphrt/serve/server.py: uvicorn with the
    connection guards) on an already-bound 127.0.0.1 socket (no port race)."""

    def __init__(self, app):
        from graphrt.serve.server import build_server
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = build_server(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()

    def client(self):
        import openai
        return openai.OpenAI(base_url=self.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*"'
                    r'(,[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*")*\})? (-?[0-9.eE+-]+|\+Inf|-Inf|NaN)$')
META = re.compile(r"^# (HELP [a-zA-Z_:][a-zA-Z0-9_:]* .*|TYPE [a-zA-Z_:][a-zA-Z0-9_:]* "
                  r"(counter|gauge|histogram|summary|untyped))$")


def parse_metrics(text: str) -> dict[str, float]:
    """Every line must be a HELP / TYPE comment or a sample; returns {name{labels}: value}."""
    assert text.endswith("\n")
    out, types = {}, {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert META.match(line), f"bad comment line: {line!r}"
            if line.startswith("# TYPE"):
                _, _, name, kind = line.split()
                types[name] = kind
            continue
        m = SAMPLE.match(line)
        assert m, f"bad sample line: {line!r}"
        name = m.group(1)
        base = re.sub(r"_(bucket|sum|count|total)$", "", name)
        assert name in types or base in types or name.removesuffix("_total") in types, f"no TYPE for {name}"
        out[name + (m.group(2) or "")] = float(m.group(4))
    return out


def get_metrics(live) -> dict[str, float]:
    """GET /metrics from a LiveServer, checked and parsed (parse_metrics)."""
    conn = http.client.HTTPConnection("127.0.0.1", live.port, timeout=10)
    conn.request("GET", "/metrics")
    r = conn.getresponse()
    assert r.status == 200 and r.getheader("Content-Type").startswith("text/plain; version=0.0.4")
    return parse_metrics(r.read().decode())


def health_waits_while(live, job, *, pause: float = 0.02) -> list[float]:
    """Run job() on a thread and poll GET /health until it returns: every poll's wait in seconds
    (each answered 200). An exception in job only ends the polling (threads do not raise into the
    test): job records what it checked, and the test asserts on that record."""
    done = threading.Event()

    def run():
        try:
            job()
        finally:
            done.set()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    conn = http.client.HTTPConnection("127.0.0.1", live.port, timeout=60)
    waits = []
    while not done.is_set():
        t0 = time.monotonic()
        conn.request("GET", "/health")
        r = conn.getresponse()
        assert r.status == 200 and r.read()
        waits.append(time.monotonic() - t0)
        time.sleep(pause)
    conn.close()
    t.join(60)
    return waits


def wait_for(cond, timeout=20.0) -> bool:
    """Poll cond() every 20 ms until true (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def pages_full(llm) -> bool:
    """Every KV page of the LLM's engine is back on the free list."""
    a = llm.engine.scheduler.allocator
    return a.num_free == a.num_pages
