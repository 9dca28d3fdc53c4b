"""`graphrt serve MODEL [--config YAML] [--graph-cache DIR] [--device cuda|cpu] [--host H] [--port P] ...`.

MODEL (or --model) is a directory or a Hugging Face repo id; the vLLM-named flags (--max-model-len,
--max-num-seqs, --dtype, --gpu-memory-utilization, --api-key, --chat-template) are in flags.py.
Before anything is loaded: the flags and --config are validated, the device is checked (CUDA
asked for where there is none, FlashInfer missing on CUDA, a dtype the CPU cannot run: one line
and exit 2), the listening socket is bound (a busy port is one line and exit 2, not an error
after minutes of loading), the device is chosen (cuda if available, else cpu with Triton's
interpreter) and the model is resolved (a local directory, or a Hugging Face repo id through
huggingface_hub's cache).

Start-up logs what was loaded, from where, and how long each phase took: graph-cache check,
weights (bytes, GB/s), kernels (graph warm-up), graph capture, tokenizer + runtime construction,
and with --graph-cache how many Triton kernels were loaded from it and compiled outside it (the
cache itself is never written by Triton: graphrt/cache/triton_cache.py). While requests run, a
stats line every --stats-interval seconds (graphrt/serve/stats_log.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import socket
import sys
import time
from pathlib import Path

log = logging.getLogger("graphrt.serve")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows "(default: X)" after every option that has a default; options whose default is
    None say in their help what None means."""

    def _get_help_string(self, action):
        if action.default is None or action.default is argparse.SUPPRESS or action.required:
            return action.help
        return super()._get_help_string(action)


def build_parser(prog: str = "graphrt serve") -> argparse.ArgumentParser:
    from graphrt import __version__
    from graphrt.serve.config import (DEFAULT_BODY_TIMEOUT_S, DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS,
                                      DEFAULT_MAX_WAITING, DEFAULT_SHUTDOWN_TIMEOUT_S)
    from graphrt.serve.flags import add_model_flags
    p = argparse.ArgumentParser(prog=prog, formatter_class=_HelpFormatter,
                                description="OpenAI-compatible HTTP server over the graphrt engine "
                                            "(/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics).")
    p.add_argument("--model", default=None, metavar="DIR|ORG/NAME",
                   help="checkpoint: a local directory in the HF layout (Llama 3.x, Qwen2/2.5, Qwen3), or a "
                        "Hugging Face repo id (org/name) taken from the HF cache or downloaded; a directory wins "
                        "(default: none; give it here or as MODEL)")
    add_model_flags(p)                             # MODEL, --max-model-len, --max-num-seqs, --dtype, ...
    p.add_argument("--revision", default=None, metavar="REV",
                   help="with a repo id: branch, tag or commit (default: main)")
    p.add_argument("--config", default=None, metavar="YAML",
                   help="YAML: EngineConfig fields (max_batch or max_num_seqs, steps_per_graph, backend, ...) and "
                        "served_model_name, max_waiting, api_key, chat_template; flags given win "
                        "(default: none, the engine's defaults)")
    p.add_argument("--graph-cache", default=None, metavar="DIR",
                   help="graph cache directory (graphrt-capture --model MODEL --out DIR, same engine flags): "
                        "Triton kernels are read from it, never written; one it lacks compiles into your Triton "
                        "cache with a warning (default: none, kernels compile on first use)")
    p.add_argument("--expect-digest", default=None, metavar="HEX",
                   help="with --graph-cache: refuse a cache whose manifest sha256 is not HEX (graphrt-capture prints it; default: none, no pin)")
    p.add_argument("--device", default=None, choices=["cuda", "cpu"],
                   help="default: cuda if available, else cpu (Triton kernels interpreted: slow, for tests)")
    p.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                   help="shard the model over N GPUs, one process each (graphrt/parallel)")
    p.add_argument("--quantization", default=None, choices=["fp8", "int4"],
                   help="fp8 / int4: quantize a float checkpoint's linear layers to FP8 (per channel) / int4 "
                        "(round-to-nearest, group 128) while loading (default: none; FP8, GPTQ, AWQ and "
                        "compressed-tensors checkpoints load as such by themselves)")
    p.add_argument("--speculative-method", default=None, choices=["ngram", "draft", "eagle3"],
                   help="speculative decoding: ngram (prompt lookup over each request's own tokens), "
                        "draft (a smaller checkpoint, --draft-model) or eagle3 (an EAGLE-3 head, --draft-model) "
                        "(default: none, no speculation)")
    p.add_argument("--draft-model", default=None, metavar="DIR",
                   help="with --speculative-method draft: the draft checkpoint, sharing the target's tokenizer; "
                        "with eagle3: the EAGLE-3 head directory (default: none)")
    p.add_argument("--num-speculative-tokens", type=int, default=None, metavar="K",
                   help="with --speculative-method: tokens proposed per round (default: 4)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="TCP port to listen on")
    p.add_argument("--served-model-name", default=None, metavar="NAME",
                   help="the `model` clients send (default: --model as given)")
    p.add_argument("--max-waiting", type=int, default=None, metavar="N",
                   help=f"queued sequences (a prompt's n samples each count) beyond the decode slots before "
                        f"503 (default: {DEFAULT_MAX_WAITING}, or max_waiting in --config)")
    p.add_argument("--max-request-bytes", type=int, default=None, metavar="N",
                   help="refuse request bodies larger than N bytes with 413 (default: 4 MiB)")
    p.add_argument("--header-timeout", type=float, default=None, metavar="SECONDS", dest="header_timeout_s",
                   help=f"a request's headers must arrive within this many seconds of the connection's start "
                        f"(or the previous response's end), else 408 and the connection is closed "
                        f"(default: {DEFAULT_HEADER_TIMEOUT_S:g}, or header_timeout_s in --config)")
    p.add_argument("--body-timeout", type=float, default=None, metavar="SECONDS", dest="body_timeout_s",
                   help=f"a request's body must arrive whole within this many seconds of its headers, else 408 "
                        f"(default: {DEFAULT_BODY_TIMEOUT_S:g}, or body_timeout_s in --config)")
    p.add_argument("--max-connections", type=int, default=None, metavar="N", dest="max_connections",
                   help=f"open connections; one more is answered 503 and closed at once "
                        f"(default: {DEFAULT_MAX_CONNECTIONS}, or max_connections in --config)")
    p.add_argument("--shutdown-timeout", type=float, default=None, metavar="SECONDS", dest="shutdown_timeout_s",
                   help=f"on SIGTERM in-flight streams end with an error event and the server exits within this "
                        f"many seconds (default: {DEFAULT_SHUTDOWN_TIMEOUT_S:g}, or shutdown_timeout_s in --config)")
    p.add_argument("--stats-interval", type=float, default=5.0, metavar="SECONDS",
                   help="log a stats line this often while requests run (0: never)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="log level of graphrt and uvicorn")
    p.add_argument("--version", action="version", version=f"graphrt {__version__}")
    return p


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind (not yet listen) the server's TCP socket before the model loads, so a port another
    server listens on is reported at once; uvicorn listens on this socket once the model is up
    (until then connections are refused, not queued). SO_REUSEADDR as uvicorn sets it: a port
    whose old connections are in TIME_WAIT counts as free. Raises ValueError naming --port / --host."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"--port: must be in [1, 65535], got {port}")
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as e:
        raise ValueError(f"--host: cannot resolve {host!r} ({e})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)     # as uvicorn: a TIME_WAIT port is free
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        why = "is already in use" if e.errno in (98, 48, 10048) else f"cannot be bound ({e.strerror})"
        raise ValueError(f"--port: {host}:{port} {why}; stop the other server or choose another --port") from None
    return sock


SERVER_FLAGS = ("header_timeout_s", "body_timeout_s", "max_connections", "shutdown_timeout_s")   # ServeConfig fields


def resolve_configs(args):
    """-> (EngineConfig, ServeConfig) from --config and the flags (flags win)."""
    from graphrt.engine import EngineConfig
    from graphrt.serve.config import ServeConfig, load_serve_yaml
    from graphrt.serve.flags import engine_overrides, model_path, serve_overrides
    engine_fields = tuple(f.name for f in dataclasses.fields(EngineConfig))
    eng_kw, srv_kw = load_serve_yaml(args.config, engine_fields) if args.config else ({}, {})
    eng_kw, srv_kw = engine_overrides(args, eng_kw), serve_overrides(args, srv_kw)
    if args.served_model_name is not None:
        srv_kw["served_model_name"] = args.served_model_name
    if args.max_waiting is not None:
        srv_kw["max_waiting"] = args.max_waiting
    if getattr(args, "max_request_bytes", None) is not None:
        srv_kw["max_request_bytes"] = args.max_request_bytes
    for name in SERVER_FLAGS:
        if getattr(args, name, None) is not None:
            srv_kw[name] = getattr(args, name)
    srv_kw.setdefault("served_model_name", str(model_path(args)))
    spec = speculative_from_flags(args)
    if spec is not None:
        eng_kw["speculative"] = spec
    return EngineConfig(**eng_kw), ServeConfig(**srv_kw)


_SPEC_FLAGS = {"method": "--speculative-method", "draft_model": "--draft-model",
               "num_tokens": "--num-speculative-tokens"}


def speculative_from_flags(args):
    """The speculative flags -> a SpeculativeConfig, or None without --speculative-method.
    ValueError naming the flag."""
    from graphrt.speculative.config import SpeculativeConfig
    method = getattr(args, "speculative_method", None)
    draft, k = getattr(args, "draft_model", None), getattr(args, "num_speculative_tokens", None)
    if method is None:
        if draft is not None or k is not None:
            raise ValueError(f"--speculative-method: needed with {'--draft-model' if draft else '--num-speculative-tokens'}")
        return None
    kw = {"method": method, "draft_model": draft}
    if k is not None:
        kw["num_tokens"] = k
    try:
        return SpeculativeConfig(**kw)
    except ValueError as e:
        msg = str(e)
        for field, flag in _SPEC_FLAGS.items():
            if msg.startswith(f"speculative.{field}:"):
                raise ValueError(flag + msg[len(f"speculative.{field}"):]) from None
        raise


def load(args, *, keep=None):
    """Load the checkpoint and build the engine, logging each phase. -> (llm, ServeConfig).

    With --graph-cache, Triton reads kernels from the cache through graphrt/cache/load.py's
    reading_from (never writing into it) while the engine loads; keep (a contextlib.ExitStack)
    keeps that scope open after loading, until the caller closes it (the server's lifetime: kernels
    first launched by a request are read from the cache too); without it, it closes here."""
    from contextlib import ExitStack, nullcontext

    from graphrt.engine.device import resolve_device, select_triton_mode
    from graphrt.checkpoint.hub import resolve_model
    from graphrt.serve.flags import model_path
    model = model_path(args)
    device = resolve_device(args.device)
    select_triton_mode(device)                     # cpu: Triton's interpreter, before any kernel loads
    engine_cfg, serve_cfg = resolve_configs(args)
    if getattr(args, "expect_digest", None) is not None and not args.graph_cache:
        raise ValueError("--expect-digest: only meaningful with --graph-cache DIR")
    revision = getattr(args, "revision", None)
    model_dir = resolve_model(model, revision=revision)
    if str(model_dir) != str(model):
        log.info("model %s%s: snapshot %s", model, f" at {revision}" if revision else "", model_dir)
    cache_dir = Path(args.graph_cache) if args.graph_cache else None
    if cache_dir is not None:
        from graphrt.cache.load import stat_snapshot
        from graphrt.serve.cache_pin import open_for_serving
        opened = open_for_serving(cache_dir, expect_digest=args.expect_digest, model_dir=model_dir,
                                  engine_cfg=engine_cfg, device_type=device.type,
                                  quantization=args.quantization, tensor_parallel=args.tensor_parallel)
        before = stat_snapshot(cache_dir)
        log.info("graph cache %s: %d artifacts (%.1f MB) verified in %.2f s (trust, manifest, sha256); "
                 "first uses, which LLM() would pay otherwise: versions and GPU %.2f s (Triton's import, "
                 "CUDA init), model config %.2f s (config.json)", cache_dir.resolve(),
                 len(opened.manifest.data["artifacts"]), sum(size for size, _ in before.values()) / 1e6,
                 opened.verify_s, opened.environment_s, opened.model_s)
    from graphrt.cache.load import reading_from
    from graphrt.engine import LLM
    log.info("loading %s on %s (%s)", Path(model_dir).resolve(), device, engine_cfg)
    t0 = time.perf_counter()
    stack = keep if keep is not None else ExitStack()
    with nullcontext() if keep is not None else stack:   # Triton reads the cache while the engine loads
        kernels = stack.enter_context(reading_from(cache_dir)) if cache_dir is not None else None
        plans = opened.manifest.data.get("plans") if cache_dir is not None else None   # split-K, K measured
        llm = LLM(model_dir, device=device, config=engine_cfg, tensor_parallel=args.tensor_parallel,
                  quantization=args.quantization, plans=plans)
    total = time.perf_counter() - t0
    ck = llm.checkpoint
    log.info("weights: %s %s (%d layers, hidden %d) %.2f GB in %.2f s (%.2f GB/s) from %s", ck.arch, ck.dtype,
             ck.spec.num_layers, ck.spec.hidden_size, ck.nbytes / 1e9, ck.load_s,
             ck.nbytes / 1e9 / max(ck.load_s, 1e-9), ck.path)
    for line in capture_report(llm, total):
        log.info("%s", line)
    rc = llm.runtime.caps.config
    log.info("engine: backend %s, max_batch %d, K=%d, page_size %d, %d KV pages, max_model_len %d; total %.2f s",
             rc.backend, llm.config.max_batch, llm.config.steps_per_graph, rc.page_size, llm.runtime.caps.num_pages,
             llm.engine.max_model_len, total)
    if cache_dir is not None:
        from graphrt.serve.cache_pin import log_after_load
        log_after_load(log, cache_dir, before, kernels)
    return llm, serve_cfg


def capture_report(llm, total_s: float) -> list[str]:
    """Start-up phases after the weights: graph warm-up (kernel compilation / loading, first
    touch) and capture, from the runtime's per-bucket CaptureStats; the rest is tokenizer and
    runtime construction."""
    graphs = getattr(llm.runtime, "graphs", None)
    stats = list(graphs.stats.values()) if graphs is not None else []
    rest = total_s - llm.checkpoint.load_s
    if not stats:
        return [f"tokenizer + runtime: {rest:.2f} s (no CUDA graphs: eager decode)"]
    warm = sum(st.warmup_ms for st in stats) / 1e3
    cap = sum(st.capture_ms for st in stats) / 1e3
    mem = sum(st.graph_bytes for st in stats) / 2**20
    return [f"kernels (graph warm-up: compile or load from cache, first touch): {warm:.2f} s",
            f"graph capture: {len(stats)} graphs ({len(stats) // len({st.bucket for st in stats})} per bucket) "
            f"in {cap:.2f} s, {mem:.1f} MiB",
            f"tokenizer + runtime construction: {max(rest - warm - cap, 0.0):.2f} s"]


def main(argv=None, *, prog: str = "graphrt serve") -> None:
    args = build_parser(prog).parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from graphrt.cache.load import CacheMismatchError
    try:
        if not args.stats_interval >= 0:
            raise ValueError(f"--stats-interval: must be >= 0 seconds, got {args.stats_interval}")
        from graphrt.serve.flags import preflight
        engine_cfg, _ = resolve_configs(args)      # MODEL, the flags and --config, validated
        preflight(args, engine_cfg)                # device, FlashInfer, dtype: before anything loads
        sock = bind_socket(args.host, args.port)   # before the model loads: a busy port fails at once
    except ValueError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    from contextlib import ExitStack
    kernel_scope = ExitStack()                     # --graph-cache: Triton reads it while we serve
    try:
        llm, serve_cfg = load(args, keep=kernel_scope)
    except (ValueError, CacheMismatchError) as e:  # bad flag, config, checkpoint or cache: one clear line
        sock.close()
        kernel_scope.close()
        print(f"{prog}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except BaseException:
        sock.close()
        kernel_scope.close()
        raise
    from graphrt.serve.app import create_app
    from graphrt.serve.server import build_server
    from graphrt.serve.stats_log import StatsLogger
    app = create_app(llm, serve_cfg)
    stats = StatsLogger(app.state.bridge, app.state.metrics, interval_s=args.stats_interval)
    log.info("serving %r on http://%s:%d/v1", serve_cfg.served_model_name, args.host, args.port)
    from graphrt.serve.supervise import serve_until_dead
    try:
        stats.start()
        code = serve_until_dead(build_server(app, host=args.host, port=args.port, log_level=args.log_level),
                                llm.engine, sockets=[sock])   # listens on the socket bound above
    finally:
        stats.stop()
        sock.close()
        llm.shutdown()                             # tensor-parallel workers, if any
        kernel_scope.close()
    if code:                                       # the engine died: a supervisor restarts us
        raise SystemExit(code)


__all__ = ["main", "build_parser", "load", "capture_report", "bind_socket"]
