"""The flags a vLLM user types first, for `graphrt serve`, and the checks made before anything loads.

    graphrt serve MODEL --max-model-len 4096 --max-num-seqs 8 --dtype bfloat16 \
        --gpu-memory-utilization 0.85 --api-key KEY --chat-template tmpl.jinja \
        --no-prefix-caching --max-num-batched-tokens 2048 --steps-per-graph auto

MODEL (positional) is `--model`; --max-num-seqs is EngineConfig.max_batch. Each flag has a key
of the same name in the --config YAML (`max_num_seqs` or `max_batch`); a flag given wins over the
file. The API key: --api-key, else the GRAPHRT_API_KEY environment variable, else `api_key` in
the YAML. --chat-template: a file, or the Jinja text itself.

`preflight` runs before the socket is bound and the model loads: the device (CUDA asked for on a
machine without it), FlashInfer on CUDA, the dtype on a CPU; each is one ValueError in the CLI's
words (`graphrt serve: error: ...`, exit 2).
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

API_KEY_ENV = "GRAPHRT_API_KEY"
DTYPES = ("auto", "bfloat16", "float16", "float32")
ALIASES = {"max_num_seqs": "max_batch"}   # YAML key -> EngineConfig field
NO_PACING = "none"                         # --max-prefill-stall none: chunks by tokens only


def _stall_arg(v: str):
    """--max-prefill-stall: a number (checked by EngineConfig), `auto` or `none`."""
    if v.strip().lower() in (NO_PACING, "auto"):
        return v.strip().lower()
    try:
        return float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'none', got {v!r}") from None


def _steps_arg(v: str):
    """--steps-per-graph: an int, or the text as given (`auto`, or a bad value that EngineConfig
    refuses in one line naming steps_per_graph)."""
    text = v.strip().lower()
    try:
        return int(text)
    except ValueError:
        return text


def add_model_flags(p: argparse.ArgumentParser) -> None:
    """The positional MODEL and the vLLM-named flags (their defaults are EngineConfig's)."""
    from graphrt.engine.config import DEFAULT_MAX_MODEL_LEN, EngineConfig
    d = EngineConfig()
    p.add_argument("model_arg", nargs="?", default=None, metavar="MODEL",
                   help="the checkpoint, as --model (give one of the two; default: none)")
    p.add_argument("--max-model-len", type=int, default=None, metavar="N",
                   help=f"prompt + max_tokens limit per request (default: the model's max_position_embeddings, "
                        f"at most {DEFAULT_MAX_MODEL_LEN}, or max_model_len in --config)")
    p.add_argument("--max-num-seqs", type=int, default=None, metavar="N",
                   help=f"concurrent requests: decode slots, the largest graph bucket (default: {d.max_batch}, "
                        f"or max_num_seqs / max_batch in --config)")
    p.add_argument("--dtype", default=None, choices=DTYPES,
                   help="weights and KV cache (default: auto = float32 on CPU, the only dtype there; "
                        "the checkpoint's bfloat16 / float16 on CUDA)")
    p.add_argument("--kv-cache-dtype", default=None, choices=("auto", "fp8"),
                   help="KV cache pages: auto = the model dtype; fp8 = e4m3 with per-layer k / v scales "
                        "(the checkpoint's, else calibrated on the first prompt): twice the tokens per "
                        "byte (default: auto, or kv_cache_dtype in --config)")
    p.add_argument("--gpu-memory-utilization", type=float, default=None, metavar="F",
                   help=f"fraction of the GPU's memory for weights, activations and the KV pool "
                        f"(default: {d.gpu_memory_utilization}, or gpu_memory_utilization in --config)")
    p.add_argument("--no-prefix-caching", dest="prefix_caching", action="store_false", default=None,
                   help="prefill every prompt whole instead of reusing the KV pages of a cached prefix "
                        "(default: prefix caching on, or enable_prefix_caching in --config)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None, metavar="N",
                   help=f"prompt tokens prefilled between two decode blocks while requests decode; longer "
                        f"prompts run in chunks (default: {d.max_num_batched_tokens}, or "
                        f"max_num_batched_tokens in --config)")
    p.add_argument("--steps-per-graph", type=_steps_arg, default=None, metavar="K|auto",
                   help=f"decode steps per CUDA graph replay; auto: 1 where the decode step measured at "
                        f"start-up takes >= 2 ms (8B-class models: first tokens sooner), else 4 (the host's "
                        f"work per block hidden behind short steps) (default: {d.steps_per_graph}, or "
                        f"steps_per_graph in --config)")
    p.add_argument("--max-prefill-stall", type=_stall_arg, default=None, metavar="F|auto|none",
                   help=f"while requests decode, a prompt chunk may add at most this share of a decode "
                        f"block's measured time (the chunk's tokens follow the measured prefill cost, up to "
                        f"--max-num-batched-tokens; none: chunks by tokens only; auto: 1.0, or none where K "
                        f"is 1; default: {d.max_prefill_stall}, or max_prefill_stall in --config)")
    p.add_argument("--mixed-prefill-tokens", type=int, default=None, metavar="N",
                   help=f"while requests decode, a decode block carries up to N tokens of a long prompt in "
                        f"its first step (the weights streamed once for both; 0: off; default: "
                        f"{d.mixed_prefill_tokens}, or mixed_prefill_tokens in --config)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help=f"require 'Authorization: Bearer KEY' on every endpoint but /health (default: "
                        f"${API_KEY_ENV}, or api_key in --config; none: no authentication)")
    p.add_argument("--chat-template", default=None, metavar="FILE|TEXT",
                   help="Jinja chat template for /v1/chat/completions, a file or the template itself "
                        "(default: the tokenizer's, or chat_template in --config)")


def model_path(args) -> str:
    """MODEL or --model (one of them, or both the same) -> the checkpoint as given."""
    pos, flag = getattr(args, "model_arg", None), getattr(args, "model", None)
    if pos is not None and flag is not None and pos != flag:
        raise ValueError(f"MODEL: given twice, {pos!r} and --model {flag!r}; give one")
    if pos is None and flag is None:
        raise ValueError("MODEL: the checkpoint is required (graphrt serve DIR|ORG/NAME, or --model)")
    return pos if pos is not None else flag


def engine_overrides(args, eng_kw: dict) -> dict:
    """EngineConfig kwargs from the YAML (aliases resolved) with the flags given on top."""
    out = dict(eng_kw)
    for alias, field in ALIASES.items():
        if alias in out:
            if field in out and out[field] != out[alias]:
                raise ValueError(f"--config: {alias} ({out[alias]}) and {field} ({out[field]}) disagree; give one")
            out[field] = out.pop(alias)
    flags = {"max_model_len": args.max_model_len, "max_batch": args.max_num_seqs,
             "steps_per_graph": getattr(args, "steps_per_graph", None),
             "gpu_memory_utilization": args.gpu_memory_utilization,
             "kv_cache_dtype": getattr(args, "kv_cache_dtype", None),
             "enable_prefix_caching": getattr(args, "prefix_caching", None),
             "max_num_batched_tokens": getattr(args, "max_num_batched_tokens", None),
             "max_prefill_stall": getattr(args, "max_prefill_stall", None),
             "mixed_prefill_tokens": getattr(args, "mixed_prefill_tokens", None)}
    out |= {k: v for k, v in flags.items() if v is not None}
    if out.get("max_prefill_stall") == NO_PACING:  # given as `none` (None above means not given)
        out["max_prefill_stall"] = None
    if args.dtype == "auto":                       # auto given: the device's default, whatever the file says
        out.pop("dtype", None)
    elif args.dtype is not None:
        out["dtype"] = args.dtype
    return out


def serve_overrides(args, srv_kw: dict, *, environ=os.environ) -> dict:
    """ServeConfig kwargs: the API key (flag, env, YAML) and the chat template's text."""
    out = dict(srv_kw)
    key = args.api_key if args.api_key is not None else environ.get(API_KEY_ENV)
    if key is not None:
        out["api_key"] = key
    template = args.chat_template if args.chat_template is not None else out.get("chat_template")
    if template is not None:
        out["chat_template"] = read_chat_template(template)
    return out


def read_chat_template(value) -> str:
    """A template file's text, or `value` itself when it reads as Jinja ({{ or {%)."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"--chat-template: expected a file or Jinja text, got {value!r}")
    if "{{" in value or "{%" in value:
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(f"--chat-template: no such file {value!r} (and not Jinja text: no {{{{ or {{%)")
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--chat-template: cannot read {value!r}: {e}") from None


def preflight(args, engine_cfg) -> None:
    """Checks that need no model: raise ValueError in the CLI's words."""
    import importlib.util

    import torch
    missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(f"graphrt serve needs {' and '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
                         f"not installed: pip install 'graphrt[serve]'")

    from graphrt.attention.flashinfer_import import flashinfer_installed, install_line
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device cuda: torch {torch.__version__} sees no CUDA device on this host; "
                         f"use --device cpu or leave --device out")
    if device == "cuda" and not flashinfer_installed():
        raise ValueError(f"--device cuda: graphrt needs FlashInfer on CUDA, which is not installed: {install_line()}")
    from graphrt.kernels.triton_import import INSTALL, triton_installed
    if device == "cuda" and not triton_installed():
        raise ValueError(f"--device cuda: graphrt needs Triton on CUDA, which is not installed: {INSTALL}")
    if device == "cpu" and engine_cfg.dtype not in (None, "float32"):
        raise ValueError(f"--dtype {engine_cfg.dtype}: on a CPU graphrt runs float32 only; "
                         f"use --dtype float32 or auto")


__all__ = ["add_model_flags", "model_path", "engine_overrides", "serve_overrides", "preflight",
           "read_chat_template", "API_KEY_ENV"]
