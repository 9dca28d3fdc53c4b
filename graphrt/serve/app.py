"""The FastAPI application: routes, error handlers, and the engine's lifetime.

    app = create_app(llm, ServeConfig(served_model_name="m"))   # llm: graphrt.LLM
    uvicorn.run(app, host="127.0.0.1", port=8000)

Routes: POST /v1/completions, POST /v1/chat/completions (completions.py), GET /v1/models,
GET /v1/models/{id}, GET /health, GET /metrics (metrics.py). Bodies over
config.max_request_bytes are refused with 413, bodies slower than config.body_timeout_s with 408
(limits.py); request bodies are parsed off the event loop (completions.py); with config.api_key
every route but /health needs `Authorization: Bearer <key>` (401 otherwise, auth.py); /health is
503 once the engine died. The app starts the engine's background thread on start-up (unless it
already runs) and stops it on shut-down if it started it; on start-up it also freezes the heap so
far out of the garbage collector (gc.freeze: a full collection then scans only what requests
allocate, not the modules and the model, which stalled every stream ~0.2 s). The server around
it (connection bound, header deadline, bounded shutdown): server.py.
"""
from __future__ import annotations

import gc
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from graphrt.serve.auth import ApiKeyAuth
from graphrt.serve.bridge import AsyncEngine
from graphrt.serve.completions import Generation
from graphrt.serve.config import ServeConfig
from graphrt.serve.errors import APIError, clip, error_body, install_handlers
from graphrt.serve.limits import BodyLimit
from graphrt.serve.metrics import Metrics
from graphrt.serve.protocol import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def create_app(llm, config: ServeConfig | None = None, *, model_name: str | None = None) -> FastAPI:
    """llm: a graphrt.LLM (its engine, tokenizer and config). The served name is, in order,
    config.served_model_name, model_name, the checkpoint directory's path. config.api_key: every
    route but /health needs the bearer key (auth.py); config.chat_template replaces the LLM's
    tokenizer's template (llm.chat uses it too)."""
    config = config or ServeConfig()
    engine = llm.engine
    if config.chat_template is not None:           # the server's template (--chat-template) replaces the tokenizer's
        llm.tokenizer.chat_template = config.chat_template
    name = config.served_model_name or model_name or str(llm.checkpoint.path)
    metrics = Metrics()
    bridge = AsyncEngine(engine, max_batch=llm.config.max_batch, max_waiting=config.max_waiting, metrics=metrics)
    gen = Generation(bridge, llm.tokenizer, model_name=name, max_model_len=engine.max_model_len)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        started = not engine.threaded
        if started:
            engine.start()
        gc.collect()                                   # the start-up heap (modules, model, tokenizer) out of
        gc.freeze()                                    # the collector's reach: a full collection scans only
        try:                                           # what requests allocate (~0.2 s stalls before)
            yield
        finally:
            bridge.close()
            gen.close()                                # the tokenizer process, if one started
            if started:
                engine.shutdown()                      # ends requests still in flight ("abort")
            gc.unfreeze()                              # collectable again (a process that goes on)

    app = FastAPI(title="graphrt", lifespan=lifespan)
    app.state.bridge, app.state.metrics, app.state.model_name = bridge, metrics, name
    app.state.serve_config, app.state.long_texts = config, gen.long_texts     # long_texts: tokenizer_process.py
    install_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=config.max_request_bytes, timeout_s=config.body_timeout_s)
    if config.api_key is not None:                 # added last: runs first, before the body is read
        app.add_middleware(ApiKeyAuth, api_key=config.api_key)

    # the bodies are parsed by gen.parse (worker pool), not by FastAPI on the event loop; openapi_extra
    # keeps their schema in /docs
    @app.post("/v1/completions", openapi_extra=_body_schema(CompletionRequest))
    async def completions(request: Request):
        return await gen.completions(await gen.parse(request, CompletionRequest), request)

    @app.post("/v1/chat/completions", openapi_extra=_body_schema(ChatCompletionRequest))
    async def chat_completions(request: Request):
        return await gen.chat(await gen.parse(request, ChatCompletionRequest), request)

    @app.get("/v1/models")
    async def models():
        return ModelList(data=[ModelCard(id=name, max_model_len=engine.max_model_len)])

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        if model_id != name:
            raise APIError(404, f"model: {clip(model_id)} is not served here; this server serves {name!r}",
                           param="model")
        return ModelCard(id=name, max_model_len=engine.max_model_len)

    @app.get("/health")
    async def health():
        if not bridge.healthy():
            return JSONResponse(error_body(503, "engine: the engine loop is not running"), status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(metrics.render(bridge.stats()), media_type=PROMETHEUS_TEXT)

    return app


def _body_schema(model) -> dict:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}


__all__ = ["create_app"]
