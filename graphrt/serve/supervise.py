"""Run the HTTP server until it is stopped or the engine dies (then exit non-zero).

An unattributable engine failure (docs/engine.md, failure policy) leaves the process unable to
serve: /health answers 503 at once, and `serve_until_dead` stops the server within
`grace_s` (in-flight responses have had their error event) and returns ENGINE_DEAD_EXIT so that
`graphrt serve` exits non-zero and a supervisor restarts it.
"""
from __future__ import annotations

import logging
import threading

log = logging.getLogger("graphrt.serve")
ENGINE_DEAD_EXIT = 3


def serve_until_dead(server, engine, *, grace_s: float = 1.0, sockets=None) -> int:
    """server: a uvicorn.Server; engine: a graphrt Engine (its `dead` event). Blocks while the
    server runs; -> 0 when it stopped normally, ENGINE_DEAD_EXIT when the engine died."""
    stopped = threading.Event()

    def watch():
        while not stopped.is_set():
            if engine.dead.wait(0.2):
                log.error("engine died (%s: %s); stopping the server in %.1f s", type(engine.error).__name__,
                          engine.error, grace_s)
                stopped.wait(grace_s)
                server.should_exit = True
                return
    t = threading.Thread(target=watch, name="graphrt-serve-watchdog", daemon=True)
    t.start()
    try:
        server.run(sockets=sockets)
    finally:
        stopped.set()
    return ENGINE_DEAD_EXIT if engine.dead.is_set() else 0


__all__ = ["serve_until_dead", "ENGINE_DEAD_EXIT"]
