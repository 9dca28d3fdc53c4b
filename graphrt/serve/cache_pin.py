"""`graphrt serve --graph-cache DIR [--expect-digest HEX]`: the cache must be the pinned one and
built for this model and engine config, checked before any weight is loaded or kernel compiled.

The geometry is what the cached attention kernels are specialised for: query / KV heads,
head_dim, page_size, KV layout and dtype of the RuntimeConfig the engine would build for this
checkpoint (EngineConfig.runtime_config, the same call LLM makes). A cache built by
`graphrt-capture --model` also records what it was built for (`built_for`): the checkpoint's
config.json (sha256) and the engine settings that decide which kernels and graphs exist
(ENGINE_FIELDS); serve refuses a cache built for another, naming each field that differs. A cache
built from a runtime YAML (`graphrt-capture --config`) has no such record: only the geometry is
checked, and the model's kernels it lacks are compiled outside it (graphrt/cache/triton_cache.py).

steps_per_graph is recorded and compared as given ("auto" or K), not as the K that "auto"
chose: the check runs before the model loads, when "auto" has measured nothing yet, and a cache
holds kernels, not graphs (graphs are captured at every start), so the kernels a cache built with
"auto" holds serve "auto" whatever K the measurement picks. A cache built with an explicit K is
served with that K; with "auto" it is refused, naming engine.steps_per_graph (as any field).
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

from graphrt.cache.manifest import Manifest

GEOMETRY = ("num_qo_heads", "num_kv_heads", "head_dim", "page_size", "kv_layout", "dtype")
# fields added after caches were first pinned, with the value such a cache was built with
LATER_FIELDS = {"mixed_prefill_tokens": 0}
ENGINE_FIELDS = ("max_batch", "steps_per_graph", "page_size", "max_model_len", "dtype", "kv_cache_dtype",
                 "quantization", "backend", "capture", "prefill_graph_tokens", "mixed_prefill_tokens", "tensor_parallel",
                 "speculative")


def _resolved(model_path, engine_cfg, device_type: str):
    """(LlamaSpec, dtype, max_model_len) as LLM resolves them, from config.json only."""
    from graphrt.checkpoint.files import read_spec
    from graphrt.checkpoint.loader import file_dtype
    path = Path(model_path)
    raw, _, spec = read_spec(path)
    import torch
    dtype = engine_cfg.dtype or ("float32" if device_type == "cpu" else
                                 {torch.float16: "float16"}.get(file_dtype(path), "bfloat16"))
    return spec, dtype, engine_cfg.resolve_max_model_len(int(raw.get("max_position_embeddings") or 0))


def model_runtime_config(model_path, engine_cfg, device_type: str):
    """The RuntimeConfig LLM(model_path, device, engine_cfg) would build, from config.json only."""
    return _runtime_config(_resolved(model_path, engine_cfg, device_type), engine_cfg, device_type)


def _runtime_config(resolved, engine_cfg, device_type: str):
    """model_runtime_config from _resolved's (LlamaSpec, dtype, max_model_len)."""
    spec, dtype, max_len = resolved
    return engine_cfg.runtime_config(spec, device_type=device_type, dtype=dtype, max_model_len=max_len)


def _config_sha256(directory) -> str | None:
    path = Path(directory) / "config.json"
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def built_for(model_path, engine_cfg, device_type: str, *, quantization: str | None = None,
              tensor_parallel: int = 1) -> dict:
    """What a model cache holds the kernels of: {"model": {"config_sha256", "path"}, "engine":
    {ENGINE_FIELDS}} with dtype, max_model_len and backend resolved as LLM resolves them. The
    path is recorded, not compared (a copy of the checkpoint elsewhere needs the same kernels)."""
    return _built_for(model_path, _resolved(model_path, engine_cfg, device_type), engine_cfg, device_type,
                      quantization=quantization, tensor_parallel=tensor_parallel)


def _built_for(model_path, resolved, engine_cfg, device_type: str, *, quantization: str | None,
               tensor_parallel: int) -> dict:
    """built_for from _resolved's (LlamaSpec, dtype, max_model_len) of `model_path`."""
    _, dtype, max_len = resolved
    rc = _runtime_config(resolved, engine_cfg, device_type)
    spec = engine_cfg.speculative
    engine = {"max_batch": engine_cfg.max_batch, "steps_per_graph": engine_cfg.steps_per_graph,
              "page_size": engine_cfg.page_size, "max_model_len": max_len, "dtype": dtype,
              "kv_cache_dtype": engine_cfg.kv_cache_dtype, "quantization": quantization,
              "backend": rc.backend, "capture": engine_cfg.capture,
              "prefill_graph_tokens": engine_cfg.prefill_graph_tokens,
              "mixed_prefill_tokens": engine_cfg.mixed_prefill_tokens, "tensor_parallel": tensor_parallel,
              "speculative": None if spec is None else {
                  "method": spec.method, "num_tokens": spec.num_tokens, "ngram_min": spec.ngram_min,
                  "ngram_max": spec.ngram_max,
                  "draft_config_sha256": None if spec.draft_model is None else _config_sha256(spec.draft_model)}}
    return {"model": {"config_sha256": _config_sha256(model_path), "path": str(Path(model_path).resolve())},
            "engine": engine}


def check_geometry(cache_dir: Path, cache_config: dict, model_rc) -> None:
    """CacheMismatchError naming every geometry field where the cache and the model differ."""
    from graphrt.cache.load import CacheMismatchError
    want = model_rc.to_dict()
    diff = [f"{k}: cache {cache_config.get(k)!r}, model {want.get(k)!r}" for k in GEOMETRY
            if cache_config.get(k) != want.get(k)]
    if diff:
        raise CacheMismatchError(f"{cache_dir}: built for another geometry than this model's ("
                                 + "; ".join(diff) + "); build one for it with graphrt-capture")


def check_built_for(cache_dir: Path, manifest_data: dict, want: dict) -> None:
    """CacheMismatchError (one line) naming every field of `built_for` where the cache differs
    from `want` (built_for of this server). A cache without the record passes."""
    from graphrt.cache.load import CacheMismatchError
    have = manifest_data.get("built_for")
    if have is None:
        return
    got_model, got_engine = have.get("model") or {}, have.get("engine") or {}
    diff = []
    if got_model.get("config_sha256") != want["model"]["config_sha256"]:
        diff.append(f"model.config_sha256: cache {str(got_model.get('config_sha256'))[:12]}... "
                    f"(config.json of {got_model.get('path')}), this model "
                    f"{str(want['model']['config_sha256'])[:12]}...")
    for k in ENGINE_FIELDS:
        got = got_engine.get(k, LATER_FIELDS.get(k))   # a cache older than a field: its default then
        if got != want["engine"][k]:
            diff.append(f"engine.{k}: cache {got!r}, this server {want['engine'][k]!r}")
    if diff:
        raise CacheMismatchError(f"{cache_dir}: built for another model or engine config ("
                                 + "; ".join(diff) + "); build one for this one with graphrt-capture "
                                 "--model MODEL --out DIR and the same engine flags")


@dataclass(frozen=True)
class OpenedCache:
    """What open_for_serving returns: the checked Manifest and the seconds (host wall clock) of
    its three parts, so the start-up log says which part costs what."""
    manifest: Manifest
    environment_s: float   # versions and GPU of this process (first call: Triton's import, CUDA init)
    verify_s: float        # check_cache: trust walk, manifest, sha256 of every artifact
    model_s: float         # config.json -> geometry and built_for


def open_for_serving(cache_dir: Path, *, expect_digest: str | None, model_dir, engine_cfg,
                     device_type: str, quantization: str | None, tensor_parallel: int) -> OpenedCache:
    """check_cache (trust, pin, every sha256), then the geometry and `built_for`: an OpenedCache,
    or CacheMismatchError before anything is loaded.

    The environment (library versions, GPU) is read once before check_cache, which reads it
    again: its first call pays one-time imports and CUDA initialisation (what LLM() would pay
    otherwise), timed apart from the hashing. The model's config.json is resolved once for both
    the geometry and built_for."""
    from graphrt.cache.load import check_cache
    from graphrt.cache.manifest import environment
    t0 = time.perf_counter()
    environment()
    t1 = time.perf_counter()
    manifest = check_cache(cache_dir, expect_digest=expect_digest)
    t2 = time.perf_counter()
    resolved = _resolved(model_dir, engine_cfg, device_type)
    check_geometry(cache_dir, manifest.data["config"], _runtime_config(resolved, engine_cfg, device_type))
    check_built_for(cache_dir, manifest.data, _built_for(model_dir, resolved, engine_cfg, device_type,
                                                         quantization=quantization,
                                                         tensor_parallel=tensor_parallel))
    return OpenedCache(manifest, environment_s=t1 - t0, verify_s=t2 - t1, model_s=time.perf_counter() - t2)


def log_after_load(log, cache_dir: Path, before: dict, kernels) -> None:
    """The start-up lines on the cache once the engine is up: where Triton's kernels came from
    (kernels: the ReadThroughCache, or None) and, if any file of the cache changed since `before`
    (a stat_snapshot), a warning: kernels were built into it."""
    from graphrt.cache.load import stat_snapshot
    after = stat_snapshot(cache_dir)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    if kernels is not None:
        log.info("graph cache %s: %s", cache_dir, kernels.summary())
    if changed:
        log.warning("graph cache %s: %d files were written or changed while loading (%s...): kernels it lacks "
                    "were built into it (FlashInfer's JIT modules; Triton's too where Triton has no cache-manager "
                    "knob); the next start refuses it: rebuild it with graphrt-capture --model",
                    cache_dir, len(changed), changed[:3])
    elif kernels is not None and not kernels.counts()[1]:
        log.info("graph cache %s: no kernel was compiled while loading", cache_dir)


__all__ = ["GEOMETRY", "log_after_load", "ENGINE_FIELDS", "model_runtime_config", "built_for", "check_geometry",
           "check_built_for", "open_for_serving", "OpenedCache"]
