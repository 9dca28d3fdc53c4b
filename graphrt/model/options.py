"""How a ModelRuntime runs: one frozen, validated options object, and the environment's overrides.

    opts = RuntimeOptions(steps_per_graph="auto", sampling=True, splitk=2)
    mrt = ModelRuntime(model, config, "cuda", options=opts)   # config: the RuntimeConfig (geometry)
    mrt.options                      # what it runs with: opts.with_env() (the variables below win)
    env_overrides()                  # {field: value} the environment sets, read and checked once

`RuntimeConfig` (graphrt/config.py) says what a runtime serves (heads, pages, buckets, backend:
the graph caches are keyed by it); `RuntimeOptions` says how the model runtime runs it: steps per
graph, which graphs it captures, prefill, split-K, the decode backend and the capture set-up.
Every knob is a field; the deep modules take theirs as an argument (model/splitk.py,
model/persistent.py, kernels/persistent/step.py, attention/graphs.py, kernels/launch.py) and
read no environment.

Environment variables only override fields (the A/B switches of tools/profile_step.py and
tools/bench_e2e.py); ModelRuntime applies them once, at construction (`with_env`), whatever the
field was given as. Unset or empty: the field stands. ENV lists them:
- GRAPHRT_SPLITK: splitk ("auto", 0, 1, 2 or 4)
- GRAPHRT_DECODE_BACKEND: decode_backend ("sequence", "persistent" or "auto")
- GRAPHRT_GRAPH_WARMUP: graph_warmup (an int >= 1)
- GRAPHRT_PDL: pdl (0 or 1)
- GRAPHRT_PERSISTENT_COOPERATIVE: persistent_cooperative (0 or 1)
- GRAPHRT_PERSISTENT_PREFETCH: persistent_prefetch (an int in [0, 8])
- GRAPHRT_PERSISTENT_STAGES: persistent_stages (an int in [0, 16])
A bad value raises ValueError naming the variable and what it allows. Pure host code.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Mapping

from graphrt.config import BACKENDS, check_mixed_tokens, check_steps
from graphrt.kernels.persistent.schedule import MAX_STAGES

SPLITK_SETTINGS = ("auto", 0, 1, 2, 4)
DECODE_BACKENDS = ("sequence", "persistent", "auto")
LOGPROBS_MODES = ("raw", "processed")
MAX_PREFETCH = 8


def _int(v, name: str, low: int, high: int | None = None, *, none: bool = False):
    if none and v is None:
        return v
    if isinstance(v, bool) or not isinstance(v, int) or v < low or (high is not None and v > high):
        bound = f"an int >= {low}" if high is None else f"an int in [{low}, {high}]"
        raise ValueError(f"{name}: must be {'None or ' if none else ''}{bound}, got {v!r}")
    return v


def _bool(v, name: str):
    if not isinstance(v, bool):
        raise ValueError(f"{name}: expected a bool, got {v!r}")
    return v


def splitk_setting(v, name: str = "splitk"):
    """"auto", 0, 1, 2 or 4 (ints or their strings) -> "auto" or the int; ValueError naming `name`."""
    if isinstance(v, str):
        v = v.strip().lower()
        v = int(v) if v.isdigit() else v
    if isinstance(v, bool) or v not in SPLITK_SETTINGS:
        raise ValueError(f"{name}: expected 'auto', 0, 1, 2 or 4, got {v!r}")
    return v


def decode_backend_setting(v, name: str = "decode_backend") -> str:
    """One of DECODE_BACKENDS (any case) -> it in lower case; ValueError naming `name`."""
    if not isinstance(v, str) or v.strip().lower() not in DECODE_BACKENDS:
        raise ValueError(f"{name}: expected one of {DECODE_BACKENDS}, got {v!r}")
    return v.strip().lower()


@dataclass(frozen=True, kw_only=True)
class RuntimeOptions:
    """How a ModelRuntime runs (model/runtime.py's docstring has each mechanism). Keyword-only;
    validated on construction (ValueError naming the field); `replace` and `with_env` return new
    options.

    backend: the attention backend (None: the RuntimeConfig's); steps_per_graph: K decode steps a
    graph replay, or "auto" (model/steps.py); num_pages: KV pool pages (None: config.pool_pages);
    sampling: capture the sampled graphs too; keep_logits: keep the last step's float32 logits;
    prefill_chunk_tokens: an eager prefill's chunk; fallback_to_one_step: K = 1 with a warning
    (instead of a ValueError) where the backend plans on the host; token_history: the slots keep
    their tokens (speculation); processing: the logits-processing graphs and log-probabilities;
    logprobs_mode "raw" | "processed"; logprobs_width: top-N alternatives recorded;
    prefill_graph_tokens: the prefill graphs' piece (0: eager prefill); graphed_prefill: None
    (auto: CUDA, one rank, prefill_graph_tokens > 0), True or False; splitk: the o / down split
    (model/splitk.py); mixed_prefill_tokens: a decode block's prompt chunk (model/mixed.py);
    decode_backend: greedy decode's kernel sequence or persistent step (model/persistent.py);
    graph_warmup: runs of a step before its capture (attention/graphs.py); pdl: programmatic
    dependent launch of graphrt's Triton kernels (kernels/launch.py); persistent_cooperative:
    launch the persistent step cooperatively; persistent_prefetch: its L2 prefetch distance in
    units (None: the device's default, kernels/persistent/step.py); persistent_stages: its GEMV
    weight stream, 0 three chunks in flight in registers, N a shared-memory ring of N chunks
    (kernels/persistent/gemv_ring.py); mask_positions: allowed-token
    masks a slot holds (model/token_mask.py: 1 + the most proposals a speculative round verifies
    for a constrained row; 1 without speculation)."""

    backend: str | None = None
    steps_per_graph: int | str = 1
    num_pages: int | None = None
    sampling: bool = False
    keep_logits: bool = False
    prefill_chunk_tokens: int = 8192
    fallback_to_one_step: bool = False
    token_history: bool = False
    processing: bool = False
    logprobs_mode: str = "raw"
    logprobs_width: int = 20
    prefill_graph_tokens: int = 512
    graphed_prefill: bool | None = None
    splitk: str | int = "auto"
    mixed_prefill_tokens: int = 0
    decode_backend: str = "sequence"
    graph_warmup: int = 1
    pdl: bool = True
    persistent_cooperative: bool = True
    persistent_prefetch: int | None = None
    persistent_stages: int = 0
    mask_positions: int = 1

    def __post_init__(self) -> None:
        if self.backend is not None and self.backend not in BACKENDS:
            raise ValueError(f"backend: {self.backend!r} is not None or one of {list(BACKENDS)}")
        check_steps(self.steps_per_graph)
        _int(self.num_pages, "num_pages", 1, none=True)
        for name in ("sampling", "keep_logits", "fallback_to_one_step", "token_history", "processing", "pdl",
                     "persistent_cooperative"):
            _bool(getattr(self, name), name)
        _int(self.prefill_chunk_tokens, "prefill_chunk_tokens", 1)
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode: expected 'raw' or 'processed', got {self.logprobs_mode!r}")
        _int(self.logprobs_width, "logprobs_width", 0)
        _int(self.prefill_graph_tokens, "prefill_graph_tokens", 0)
        if self.graphed_prefill is not None and not isinstance(self.graphed_prefill, bool):
            raise ValueError(f"graphed_prefill: expected None (auto), True or False, got {self.graphed_prefill!r}")
        object.__setattr__(self, "splitk", splitk_setting(self.splitk))
        check_mixed_tokens(self.mixed_prefill_tokens)
        object.__setattr__(self, "decode_backend", decode_backend_setting(self.decode_backend))
        _int(self.graph_warmup, "graph_warmup", 1)
        _int(self.persistent_prefetch, "persistent_prefetch", 0, MAX_PREFETCH, none=True)
        _int(self.persistent_stages, "persistent_stages", 0, MAX_STAGES)
        _int(self.mask_positions, "mask_positions", 1)

    def replace(self, **changes) -> "RuntimeOptions":
        """These options with `changes` (field names; ValueError naming an unknown one)."""
        unknown = sorted(set(changes) - FIELDS)
        if unknown:
            raise ValueError(f"options: unknown field(s) {unknown}; RuntimeOptions has {sorted(FIELDS)}")
        return dataclasses.replace(self, **changes) if changes else self

    def with_env(self, environ: Mapping[str, str] | None = None) -> "RuntimeOptions":
        """These options with the environment's overrides (env_overrides; default os.environ)."""
        return self.replace(**env_overrides(environ))


FIELDS = frozenset(f.name for f in dataclasses.fields(RuntimeOptions))


def _flag(v: str, name: str) -> bool:
    if v not in ("0", "1"):
        raise ValueError(f"{name}: expected 0 or 1, got {v!r}")
    return v == "1"


def _env_int(low: int, high: int | None = None):
    def parse(v: str, name: str) -> int:
        if not v.isdigit() or int(v) < low or (high is not None and int(v) > high):
            bound = f"an int >= {low}" if high is None else f"an int in [{low}, {high}]"
            raise ValueError(f"{name}: expected {bound}, got {v!r}")
        return int(v)
    return parse


# variable -> (the field it overrides, its parser: (value, variable name) -> the field's value)
ENV = {
    "GRAPHRT_SPLITK": ("splitk", splitk_setting),
    "GRAPHRT_DECODE_BACKEND": ("decode_backend", decode_backend_setting),
    "GRAPHRT_GRAPH_WARMUP": ("graph_warmup", _env_int(1)),
    "GRAPHRT_PDL": ("pdl", _flag),
    "GRAPHRT_PERSISTENT_COOPERATIVE": ("persistent_cooperative", _flag),
    "GRAPHRT_PERSISTENT_PREFETCH": ("persistent_prefetch", _env_int(0, MAX_PREFETCH)),
    "GRAPHRT_PERSISTENT_STAGES": ("persistent_stages", _env_int(0, MAX_STAGES)),
}


def env_overrides(environ: Mapping[str, str] | None = None) -> dict:
    """{field: value} of every ENV variable set (non-empty) in `environ` (default os.environ),
    each checked: ValueError naming the variable and its allowed values."""
    environ = os.environ if environ is None else environ
    out = {}
    for var, (field, parse) in ENV.items():
        v = environ.get(var, "").strip()
        if v:
            out[field] = parse(v, var)
    return out


__all__ = ["DECODE_BACKENDS", "ENV", "RuntimeOptions", "SPLITK_SETTINGS", "decode_backend_setting",
           "env_overrides", "splitk_setting"]
