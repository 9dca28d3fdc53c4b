"""The decode step's structure: per layer exactly the fused kernels and four GEMMs, nothing else
(and with fused GEMVs, model/fuse.py: four GEMVs, rope_append and attention).

Every aten op decode_step issues is recorded (kernels and the attention context are counted
stand-ins), so a stray element-wise op (a cast, a float32 copy of the logits, a torch RoPE)
fails here on CPU, before it costs launches on the GPU.
"""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import graphrt.model.llama as llama
from graphrt.model import LlamaDecoder
from graphrt.model.fuse import LayerGemvs

transformers = pytest.importorskip("transformers")
SHAPE_OPS = {"t", "view", "_unsafe_view", "reshape", "expand", "detach", "alias", "empty"}  # no kernel


class _Record(TorchDispatchMode):
    def __init__(self, log):
        super().__init__()
        self.log = log

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in SHAPE_OPS:
            self.log.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("fused", [False, True])
def test_decode_step_issues_only_fused_kernels_and_gemms(kind, fused, monkeypatch):
    torch.manual_seed(0)
    common = dict(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    cls = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}[kind]
    hf = getattr(transformers, cls + "ForCausalLM")(getattr(transformers, cls + "Config")(**common))
    model = LlamaDecoder.from_hf(hf)
    s, b = model.spec, 3
    log: list[str] = []
    rec = _Record(log)
    q = torch.zeros(b, s.num_heads, s.head_dim)

    def stand_in(name, result):
        def fn(*args, **kwargs):
            log.append(name)
            return result(*args)
        return fn
    h, act = torch.zeros(b, s.hidden_size), torch.zeros(b, s.intermediate_size)
    monkeypatch.setattr(llama, "rms_norm", stand_in("rms_norm", lambda *a: h))
    monkeypatch.setattr(llama, "add_rms_norm", stand_in("add_rms_norm", lambda *a: h))
    monkeypatch.setattr(llama, "embed_rms_norm", stand_in("embed_rms_norm", lambda *a: h))
    monkeypatch.setattr(llama, "silu_mul",
                        stand_in("silu_mul", lambda x: act))

    outs = {w.shape[0]: torch.zeros(b, w.shape[0]) for w in (model.weights.layers[0].qkv,
                                                             model.weights.layers[0].gate_up)}

    def gemv(x, w, bias=None, *, norm=None, silu=False, residual=None, **_):
        log.append("gemv" + "+norm" * (norm is not None) + "+silu" * silu + "+add" * (residual is not None)
                   + "+bias" * (bias is not None))
        return residual if residual is not None else outs[w.shape[0]]
    monkeypatch.setattr(llama, "gemv", gemv)

    class Ctx:
        rope_append = staticmethod(stand_in("rope_append", lambda *a: q))
        attention = staticmethod(stand_in("attention", lambda *a: q))

    tokens = torch.tensor([1, 2, 3])
    with rec:
        logits = model.decode_step(Ctx(), tokens, fuse=LayerGemvs() if fused else None)
    assert logits.dtype == model.dtype and logits.shape == (b, s.vocab_size)
    gemm = "addmm" if s.attention_bias else "mm"
    layer = [gemm, "rope_append", "attention", "mm", "add_rms_norm", "mm", "silu_mul", "mm",
             "add_rms_norm"]
    if fused:                          # model/fuse.py: norms, adds and SiLU-mul inside 4 GEMVs
        layer = ["gemv+norm" + "+bias" * s.attention_bias, "rope_append", "attention", "gemv+add",
                 "gemv+norm", "gemv+silu+add"]
        assert log == ["index"] + layer * s.num_layers + ["rms_norm", "mm"]
    else:
        assert log == ["embed_rms_norm"] + layer * s.num_layers + ["mm"]   # gather + norm: one launch
