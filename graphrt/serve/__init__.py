"""`graphrt serve`: an OpenAI-compatible HTTP server over the generation engine.

protocol.py (request / response bodies), errors.py (OpenAI error bodies), bridge.py (asyncio <->
the engine's thread, admission), completions.py (the two generation endpoints, SSE), metrics.py
(Prometheus text), config.py (ServeConfig, the --config YAML), limits.py (body size and deadline),
app.py (create_app), server.py (uvicorn with the connection guards and a bounded shutdown:
build_server), cli.py (`graphrt serve`, start-up log). Needs the `serve` extra (fastapi, uvicorn).
"""
from graphrt.serve.app import create_app
from graphrt.serve.config import ServeConfig

__all__ = ["create_app", "ServeConfig"]
