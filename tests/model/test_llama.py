"""The decode step's structure: per layer exactly the fused kernels and four GEMMs, nothing else

Every aten op decode_step issues is recorded (kernels and the attention context are counted
stand-ins), so a stray element-wise op (a cast, a float32 copy of the logits, a torch RoPE)
fails here on CPU, before it costs launches on the GPU.
"""
from __future__ import annotations

import dataclasses
import types

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
    model.ops = dataclasses.replace(            # the model's kernel set (kernels/ops.py), counted
        model.ops, rms_norm=stand_in("rms_norm", lambda *a: h), add_rms_norm=stand_in("add_rms_norm", lambda *a: h),
        embed_rms_norm=stand_in("embed_rms_norm", lambda *a: h), silu_mul=stand_in("silu_mul", lambda x: act),
        rope_append_decode=stand_in("rope_append", lambda *a: q))

    class Ctx:
        view = types.SimpleNamespace(block_table=None, seq_lens=None, device_error=None)
        kv_caches = [types.SimpleNamespace(scale=None)] * s.num_layers
        attention = staticmethod(stand_in("attention", lambda *a: q))

    tokens = torch.tensor([1, 2, 3])
    with rec:
        logits = model.decode_step(Ctx(), tokens)
    assert logits.dtype == model.dtype and logits.shape == (b, s.vocab_size)
    gemm = "addmm" if s.attention_bias else "mm"
    layer = [gemm, "rope_append", "attention", "mm", "add_rms_norm", "mm", "silu_mul", "mm",
             "add_rms_norm"]
    assert log == ["embed_rms_norm"] + layer * s.num_layers + ["mm"]   # gather + norm: one launch


def _tiny_hf(kind: str):
    torch.manual_seed(1)
    common = dict(vocab_size=96, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128, head_dim=64)
    cls = {"llama": "Llama", "qwen3": "Qwen3"}[kind]
    return getattr(transformers, cls + "ForCausalLM")(getattr(transformers, cls + "Config")(**common)).eval()


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_torch_and_triton_kernel_sets_agree(kind):
    """kernels="torch" (the kernels' torch references, a CPU's default) and kernels="triton" (the
    interpreted kernels): the same prefill logits, decode logits and K/V pages."""
    from graphrt import RuntimeConfig
    from graphrt.model.runtime import ModelRuntime
    hf = _tiny_hf(kind)
    runs = {}
    for kernels in ("torch", "triton"):
        model = LlamaDecoder.from_hf(hf, kernels=kernels)
        assert model.kernels == model.ops.name == kernels
        cfg = RuntimeConfig(num_qo_heads=2, num_kv_heads=1, head_dim=64, page_size=16, max_context_len=64,
                            buckets=[1, 2], dtype="float32", backend="torch", kv_pool_pages=9)
        mrt = ModelRuntime(model, cfg, "cpu", keep_logits=True)
        table = torch.arange(1, 9, dtype=torch.int32).view(2, 4)
        gen = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, 96, (n,), generator=gen) for n in (5, 17)]
        out = [mrt.prefill(prompts, table)]
        lens = torch.tensor([5, 17], dtype=torch.int32)
        for _ in range(3):
            lens += 1
            out.append(mrt.decode(torch.randint(0, 96, (2,), generator=gen), table, lens)[0].float())
            out.append(mrt.last_logits(2).clone())
        runs[kernels] = out + [mrt.kv_caches[1].k[1:9].clone()]
    for a, b in zip(runs["torch"], runs["triton"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_kernels_argument_is_checked():
    hf = _tiny_hf("llama")
    assert LlamaDecoder.from_hf(hf).kernels == "torch"          # default on a CPU
    with pytest.raises(ValueError, match="kernels"):
        LlamaDecoder.from_hf(hf, kernels="cuda")
    model = LlamaDecoder.from_hf(hf, kernels="torch")
    with pytest.raises(ValueError, match="splitk"):             # split-K partials: the Triton add+RMSNorm
        model._check_splitk((2, 1))
