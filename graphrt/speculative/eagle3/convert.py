"""Convert an EAGLE-3 head between the original and the speculators layout (same tensors).

    convert_head("head-original", "head-speculators", "speculators", verifier="meta-llama/...")
    convert_head("head-speculators", "head-original", "original")

Tensors are renamed (`midlayer.` <-> `layers.0.`) and copied bit for bit; config.json is
rebuilt from the parsed Eagle3Config (the fields graphrt reads, plus the ones each layout
requires). Converting there and back gives the same tensors and an equivalent config.
"""
from __future__ import annotations

from pathlib import Path

from graphrt.checkpoint.hf_files import CheckpointError
from graphrt.speculative.eagle3.checkpoint import read_head, write_head
from graphrt.speculative.eagle3.config import LAYOUTS, Eagle3Config


def _layer_config(cfg: Eagle3Config) -> dict:
    """The LlamaConfig fields of the head's decoder layer."""
    out = {"model_type": "llama", "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
           "intermediate_size": cfg.intermediate_size, "num_hidden_layers": 1,
           "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
           "head_dim": cfg.head_dim, "hidden_act": "silu", "rms_norm_eps": cfg.rms_norm_eps,
           "rope_theta": cfg.rope_theta, "max_position_embeddings": cfg.max_position_embeddings,
           "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False}
    if cfg.rope_scaling is not None:
        out["rope_scaling"] = dict(cfg.rope_scaling)
    if cfg.torch_dtype is not None:
        out["torch_dtype"] = cfg.torch_dtype
    return out


def original_config(cfg: Eagle3Config) -> dict:
    """config.json of the original layout."""
    out = {"architectures": ["LlamaForCausalLMEagle3"], **_layer_config(cfg),
           "draft_vocab_size": cfg.draft_vocab_size}
    if cfg.layer_ids is not None:
        out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(cfg.layer_ids),
                               "use_aux_hidden_state": True}
    if cfg.norm_before_residual:
        out["norm_before_residual"] = True
    if cfg.target_hidden_size is not None:
        out["target_hidden_size"] = cfg.target_hidden_size
    return out


def speculators_config(cfg: Eagle3Config, *, verifier: str | None = None,
                       verifier_architectures=("LlamaForCausalLM",), speculative_tokens: int = 3) -> dict:
    """config.json of the speculators layout."""
    layer = _layer_config(cfg)
    layer["architectures"] = ["LlamaForCausalLM"]
    tokens = cfg.speculative_tokens or speculative_tokens
    return {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
            "transformer_layer_config": layer, "draft_vocab_size": cfg.draft_vocab_size,
            "norm_before_residual": cfg.norm_before_residual,
            "target_hidden_size": cfg.target_hidden_size,
            "eagle_aux_hidden_state_layer_ids": None if cfg.layer_ids is None else list(cfg.layer_ids),
            "speculators_config": {
                "algorithm": "eagle3",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": tokens}],
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": verifier or cfg.verifier,
                             "architectures": list(verifier_architectures)}}}


def convert_head(src, dst, layout: str, *, verifier: str | None = None) -> Path:
    """Write the head at `src` (either layout) to `dst` in `layout`; returns `dst`."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout: {layout!r}; expected one of {list(LAYOUTS)}")
    src, dst = Path(src), Path(dst)
    if dst.resolve() == src.resolve():
        raise ValueError(f"dst: {str(dst)!r} is the source directory")
    _, cfg, tensors = read_head(src)
    if cfg.layout == layout:
        raise CheckpointError(f"{src / 'config.json'}: already in the {layout} layout")
    raw = original_config(cfg) if layout == "original" else speculators_config(cfg, verifier=verifier)
    return write_head(dst, raw, tensors, layout)


__all__ = ["convert_head", "original_config", "speculators_config"]
