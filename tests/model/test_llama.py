"""The decode step's structure: per layer exactly the fused kernels and four GEMMs, nothing else

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
def test_decode_step_issues_only_fused_kernels_and_gemms(kind, monkeypatch):
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

    class Ctx:
        rope_append = staticmethod(stand_in("rope_append", lambda *a: q))
        attention = staticmethod(stand_in("attention", lambda *a: q))

    tokens = torch.tensor([1, 2, 3])
    with rec:
        logits = model.decode_step(Ctx(), tokens)
    assert logits.dtype == model.dtype and logits.shape == (b, s.vocab_size)
    gemm = "addmm" if s.attention_bias else "mm"
    layer = [gemm, "rope_append", "attention", "mm", "add_rms_norm", "mm", "silu_mul", "mm",
             "add_rms_norm"]
    assert log == ["embed_rms_norm"] + layer * s.num_layers + ["mm"]   # gather + norm: one launch
