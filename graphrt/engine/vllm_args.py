"""vLLM's `LLM(...)` constructor names -> graphrt's (LLM's own arguments and EngineConfig fields).

    LLM(model=path, tensor_parallel_size=2, max_num_seqs=8, dtype="bfloat16", enforce_eager=True)
    # = LLM(path, tensor_parallel=2, max_batch=8, dtype="bfloat16", capture=False)

Pure (no torch): `translate(kwargs)` returns the keywords under graphrt's names. Names that
mean the same in both (max_model_len, gpu_memory_utilization, seed, quantization, revision)
pass through, as do EngineConfig's fields that vLLM shares (kv_cache_dtype,
enable_prefix_caching, max_num_batched_tokens). A vLLM name for something graphrt does not have is a ValueError naming it,
unless given vLLM's default (which changes nothing); any other unknown name is a ValueError too
(not the bare TypeError of an unexpected keyword). docs/engine.md has the table.
"""
from __future__ import annotations

from dataclasses import fields

RENAMED = {"tensor_parallel_size": "tensor_parallel", "max_num_seqs": "max_batch", "block_size": "page_size"}
DTYPES = {"auto": None, "half": "float16", "float16": "float16", "bfloat16": "bfloat16",
          "float": "float32", "float32": "float32"}
# accepted and ignored: graphrt runs no code from a checkpoint (its loader reads config.json and
# the tensors), keeps no per-iteration log to disable, and never swaps KV to host memory
IGNORED = ("trust_remote_code", "disable_log_stats", "swap_space")
# vLLM names graphrt has no feature for: accepted only at vLLM's default
VLLM_DEFAULTS = {
    "pipeline_parallel_size": 1, "data_parallel_size": 1, "cpu_offload_gb": 0,
    "tokenizer_mode": "auto", "load_format": "auto", "enable_lora": False,
    "enable_chunked_prefill": None, "tokenizer_revision": None, "download_dir": None,
    "hf_overrides": None, "max_seq_len_to_capture": None,
}
LLM_ARGS = ("device", "config", "tensor_parallel", "tp_timeout_s", "revision", "quantization")


def _is_default(value, default) -> bool:
    if default is None or isinstance(default, bool):
        return value is default
    return type(value) is type(default) and value == default


def translate(kwargs: dict, *, model=None) -> dict:
    """kwargs under vLLM's or graphrt's names -> graphrt's. ValueError naming the argument for a
    name graphrt does not have, a value it cannot honour, or one given under both names."""
    from graphrt.engine.config import EngineConfig
    known = set(LLM_ARGS) | {f.name for f in fields(EngineConfig)}
    out = {}
    for name, value in kwargs.items():
        if name in IGNORED:
            continue
        if name == "tokenizer":
            if value is not None and str(value) != str(model):
                raise ValueError(f"tokenizer: a tokenizer other than the checkpoint's is not supported "
                                 f"(got {value!r}); graphrt loads the one in the model directory")
            continue
        if name == "dtype":                            # vLLM's spellings -> EngineConfig's
            if value is not None and (not isinstance(value, str) or value not in DTYPES):
                raise ValueError(f"dtype: {value!r} is not one of {sorted(DTYPES)}")
            value = DTYPES[value] if value is not None else None
        elif name == "enforce_eager":
            if not isinstance(value, bool):
                raise ValueError(f"enforce_eager: expected a bool, got {value!r}")
            name, value = "capture", not value
        elif name in known:                            # graphrt's own name
            pass
        elif name in RENAMED:
            name = RENAMED[name]
        elif name in VLLM_DEFAULTS:
            if not _is_default(value, VLLM_DEFAULTS[name]):
                raise ValueError(f"{name}: not supported by graphrt (got {value!r}; only vLLM's default "
                                 f"{VLLM_DEFAULTS[name]!r} is accepted)")
            continue
        else:
            raise ValueError(f"{name}: not an LLM argument (graphrt's: {', '.join(sorted(known))}; "
                             f"vLLM's names it maps: {', '.join(sorted([*RENAMED, 'dtype', 'enforce_eager']))})")
        if name in out:
            raise ValueError(f"{name}: given twice (under vLLM's and graphrt's name)")
        out[name] = value
    return out


__all__ = ["translate", "RENAMED", "DTYPES", "IGNORED", "VLLM_DEFAULTS"]
