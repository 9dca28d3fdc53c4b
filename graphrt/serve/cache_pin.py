"""`graphrt serve --graph-cache DIR [--expect-digest HEX]`: the cache must be the pinned one and
built for this model's attention geometry, checked before any weight is loaded or kernel compiled.

The geometry is what the cached kernels are specialised for: query / KV heads, head_dim,
page_size, KV layout and dtype of the RuntimeConfig the engine would build for this checkpoint
(EngineConfig.runtime_config, the same call LLM makes). A cache for another geometry would make
the engine compile into the cache (or load kernels for other shapes), so it is refused, naming
each field that differs.
"""
from __future__ import annotations

from pathlib import Path

GEOMETRY = ("num_qo_heads", "num_kv_heads", "head_dim", "page_size", "kv_layout", "dtype")


def model_runtime_config(model_path, engine_cfg, device_type: str):
    """The RuntimeConfig LLM(model_path, device, engine_cfg) would build, from config.json only."""
    from transformers import AutoConfig

    from graphrt.model.hf_files import reading
    from graphrt.engine.loader import file_dtype, read_config
    from graphrt.model.spec import LlamaSpec
    path = Path(model_path)
    raw, _ = read_config(path)
    with reading(path / "config.json"):
        spec = LlamaSpec.from_hf(AutoConfig.from_pretrained(str(path)))
    import torch
    dtype = engine_cfg.dtype or ("float32" if device_type == "cpu" else
                                 {torch.float16: "float16"}.get(file_dtype(path), "bfloat16"))
    max_len = engine_cfg.resolve_max_model_len(int(raw.get("max_position_embeddings") or 0))
    return engine_cfg.runtime_config(spec, device_type=device_type, dtype=dtype, max_model_len=max_len)


def check_geometry(cache_dir: Path, cache_config: dict, model_rc) -> None:
    """CacheMismatchError naming every geometry field where the cache and the model differ."""
    from graphrt.cache.load import CacheMismatchError
    want = model_rc.to_dict()
    diff = [f"{k}: cache {cache_config.get(k)!r}, model {want.get(k)!r}" for k in GEOMETRY
            if cache_config.get(k) != want.get(k)]
    if diff:
        raise CacheMismatchError(f"{cache_dir}: built for another geometry than this model's ("
                                 + "; ".join(diff) + "); build one for it with graphrt-capture")


__all__ = ["GEOMETRY", "model_runtime_config", "check_geometry"]
