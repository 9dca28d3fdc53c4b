"""`graphrt serve`: an OpenAI-compatible HTTP server over the generation engine.

protocol.py (request / response bodies), errors.py (OpenAI error bodies), bridge.py (asyncio <->
the engine's thread, admission), completions.py (the two generation endpoints, SSE),
tokenizer_process.py (long prompt texts tokenized in a separate process), metrics.py
(Prometheus text), config.py (ServeConfig, the --config YAML), limits.py (body size and deadline),
app.py (create_app), server.py (uvicorn with the connection guards and a bounded shutdown:
build_server), cli.py (`graphrt serve`, start-up log). Needs the `serve` extra (fastapi, uvicorn).
"""
from __future__ import annotations

import importlib

# fastapi / uvicorn load with create_app, not with the package: `graphrt serve`'s flag checks,
# --help and the model's loading run without them (preflight says when they are missing)
_LAZY = {"create_app": "graphrt.serve.app", "ServeConfig": "graphrt.serve.config"}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'graphrt.serve' has no attribute {name!r}")


__all__ = ["create_app", "ServeConfig"]
