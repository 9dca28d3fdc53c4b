"""model/spec.py: LlamaSpec.from_config (config.json read with json, no transformers) gives the
spec transformers' AutoConfig gives, field by field, for configs that leave fields out."""
from __future__ import annotations

import dataclasses
import json

import pytest

from _checkpoints import write
from graphrt.model.spec import LlamaSpec

transformers = pytest.importorskip("transformers")

LLAMA3_ROPE = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192, "rope_type": "llama3"}
BASE = dict(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8)
CONFIGS = {
    "llama-3.1-8b-like": dict(BASE, architectures=["LlamaForCausalLM"], model_type="llama", num_key_value_heads=2,
                              rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE,
                              max_position_embeddings=131072, tie_word_embeddings=False, torch_dtype="bfloat16"),
    "llama-3.2-1b-tied": dict(BASE, architectures=["LlamaForCausalLM"], model_type="llama", num_key_value_heads=2,
                              head_dim=64, rope_theta=500000.0, tie_word_embeddings=True, dtype="bfloat16",
                              rope_scaling=dict(LLAMA3_ROPE, factor=32.0), max_position_embeddings=131072),
    "llama-old-type-key": dict(BASE, architectures=["LlamaForCausalLM"], model_type="llama",
                               rope_scaling={k: v for k, v in LLAMA3_ROPE.items() if k != "rope_type"} | {"type": "llama3"},
                               max_position_embeddings=16384),
    "llama-minimal": dict(BASE, architectures=["LlamaForCausalLM"], model_type="llama"),
    "llama-nulls": dict(BASE, architectures=["LlamaForCausalLM"], model_type="llama", num_key_value_heads=None,
                        head_dim=None, rope_scaling=None, attention_bias=False, mlp_bias=False),
    "llama-rope-parameters": dict(BASE, architectures=["LlamaForCausalLM"], model_type="llama",
                                  rope_parameters=dict(LLAMA3_ROPE, rope_theta=500000.0),
                                  max_position_embeddings=131072),
    "qwen2-bias": dict(BASE, architectures=["Qwen2ForCausalLM"], model_type="qwen2", num_key_value_heads=2,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
                       sliding_window=32768, max_window_layers=28, max_position_embeddings=32768),
    "qwen2-minimal": dict(BASE, architectures=["Qwen2ForCausalLM"], model_type="qwen2", num_attention_heads=32,
                          hidden_size=512),
    "qwen3-head-dim": dict(BASE, architectures=["Qwen3ForCausalLM"], model_type="qwen3", num_key_value_heads=4,
                           head_dim=128, rope_theta=1000000.0, attention_bias=False, max_position_embeddings=40960),
    "qwen3-minimal": dict(BASE, architectures=["Qwen3ForCausalLM"], model_type="qwen3", num_attention_heads=32,
                          hidden_size=512),
}


def _reference(cfg) -> LlamaSpec:
    """The spec read off AutoConfig's attributes (independent of from_config)."""
    params = dict(getattr(cfg, "rope_parameters", None) or {})
    theta = params.pop("rope_theta", None) or getattr(cfg, "rope_theta", None) or 10000.0
    if not params and getattr(cfg, "rope_scaling", None):                 # transformers 4.x
        params = dict(cfg.rope_scaling)
    kind = params.pop("rope_type", None) or params.pop("type", "default")
    params.pop("type", None)
    return LlamaSpec(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                     num_layers=cfg.num_hidden_layers, num_heads=cfg.num_attention_heads,
                     num_kv_heads=cfg.num_key_value_heads,
                     head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
                     rms_norm_eps=cfg.rms_norm_eps, rope_theta=float(theta),
                     tie_word_embeddings=cfg.tie_word_embeddings,
                     attention_bias=cfg.model_type == "qwen2" or bool(getattr(cfg, "attention_bias", False)),
                     rope_scaling=None if kind == "default" else {**params, "rope_type": kind},
                     qk_norm=cfg.model_type == "qwen3", max_position_embeddings=cfg.max_position_embeddings)


def _fields(spec: LlamaSpec) -> dict:
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}


def _check(path):
    raw = json.loads((path / "config.json").read_text())
    ours = LlamaSpec.from_config(raw)
    hf = transformers.AutoConfig.from_pretrained(str(path))
    assert _fields(ours) == _fields(_reference(hf))
    assert _fields(ours) == _fields(LlamaSpec.from_hf(hf))
    return ours


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_json_reads_as_transformers_does(tmp_path, name):
    (tmp_path / "config.json").write_text(json.dumps(CONFIGS[name]))
    spec = _check(tmp_path)
    if name == "qwen3-minimal":
        assert spec.head_dim == 128 and spec.num_kv_heads == 32 and spec.max_position_embeddings == 32768
    if name == "llama-minimal":
        assert spec.rope_scaling is None and spec.rope_theta == 10000.0 and spec.num_kv_heads == 8


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_make_checkpoint_configs(tmp_path_factory, arch):
    _check(write(tmp_path_factory, arch, arch=arch, dtype="float32"))


def test_refused_configs_name_the_field():
    for raw, field in ((dict(BASE, model_type="mistral"), "model_type"), (dict(BASE), "model_type"),
                       (dict(BASE, model_type="llama", mlp_bias=True), "mlp_bias"),
                       (dict(BASE, model_type="qwen2", use_sliding_window=True), "use_sliding_window")):
        with pytest.raises(ValueError, match=field):
            LlamaSpec.from_config(raw)
