"""The persistent decode step with quantized weights (graphrt/kernels/persistent/formats.py and the
GEMV tile's FP8 / int4 variants, gemv_tile.py) under TRITON_INTERPRET=1, one program: FP8
(per-channel and per-tensor scales, the LM head FP8 or bf16) and int4 (asymmetric group 32 with
an int4 LM head, symmetric group 64, per channel: one group of each weight's K), multiply-add and tl.dot GEMVs, against the float32 torch
reference (tests/_persistent_reference.py) run over the dequantized weights (the persistent FP8 tile
is W8A16: the activations stay in the model dtype, so the reference is the dequantized model
itself); bf16 models within bf16 rounding; the shared-memory ring equal to the register form bit
for bit; which weights are refused and why; the format's host pieces (chunk cap, the schedule's
prefetch byte counts, bad input)."""
from __future__ import annotations

import types

import pytest
import torch

from graphrt.attention.kvcache import PagedKVCache
from graphrt.kernels.persistent import PersistentStep, Tiles, unsupported
from graphrt.kernels.persistent.formats import (FMT_FP8, FMT_INT4, FMT_MODEL, NO_CAP, PER_CHANNEL, WeightFormat,
                                               weight_format)
from graphrt.kernels.persistent.schedule import F_OP, F_WB, OP_DOWN, OP_HEAD, build_schedule
from graphrt.model import LlamaDecoder
from graphrt.model.fp8_weights import dequantize_weights, quantize_weights
from graphrt.model.int4_weights import quantize_weights_int4
from graphrt.model.quant.int4 import quantize_int4
from _persistent_models import geometry
from _persistent_reference import PAGE, PAGES, assert_bf16_step, kv_at, paged_caches, reference_step

transformers = pytest.importorskip("transformers")


def _model(dtype=torch.float32):
    """Llama, GQA, 2 layers; intermediate 192 (int4 groups of 32 and 64 divide every K)."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=160, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                   max_position_embeddings=256, tie_word_embeddings=False)
    return LlamaDecoder.from_hf(transformers.LlamaForCausalLM(cfg).eval(), dtype=dtype)


def _quantized(model, kind):
    w, spec = model.weights, model.spec
    return {"fp8": lambda: quantize_weights(w, spec, "channel", lm_head=True),
            "fp8-tensor": lambda: quantize_weights(w, spec, "fused-tensor"),
            "int4": lambda: quantize_weights_int4(w, group_size=32, lm_head=True),
            "int4-sym": lambda: quantize_weights_int4(w, group_size=64, symmetric=True),
            "int4-channel": lambda: quantize_weights_int4(w, group_size=-1)}[kind]()


def _launch(model, weights, caches, lens, tokens, gemv="auto", stages=0):
    b = len(lens)
    step = PersistentStep(weights, caches, model.cos_sin, geometry=geometry(model), rows=b,
                          eps=model.spec.rms_norm_eps, tiles=Tiles(splits=2, min_keys=64), gemv=gemv, stages=stages)
    table = torch.arange(PAGES, dtype=torch.int32)[torch.randperm(PAGES, generator=torch.Generator().manual_seed(2))]
    table = table[: 4 * b].view(b, 4).contiguous()
    out = torch.full((b,), -1, dtype=torch.int64)
    err = torch.zeros(1, dtype=torch.int32)
    step.launch(tokens, lens, table, out, err)
    return step, table, out, err


CASES = [("fp8", "fma", FMT_FP8, FMT_FP8), ("fp8-tensor", "dot", FMT_FP8, FMT_MODEL),
         ("int4", "fma", FMT_INT4, FMT_INT4), ("int4-sym", "dot", FMT_INT4, FMT_MODEL),
         ("int4-channel", "fma", FMT_INT4, FMT_MODEL)]


@pytest.mark.parametrize("kind,gemv,fmt,head_fmt", CASES)
def test_against_float32_reference_of_the_dequantized_weights(kind, gemv, fmt, head_fmt):
    model = _model()
    qw = _quantized(model, kind)
    caches = paged_caches(model)
    before = [PagedKVCache(c.k.clone(), c.v.clone()) for c in caches]
    lens, tokens = torch.tensor([5, 40, 0], dtype=torch.int32), torch.tensor([3, 150, 7])
    step, table, out, err = _launch(model, qw, caches, lens, tokens, gemv=gemv)
    assert step.gemv == gemv and (step.format.fmt, step.format.head_fmt) == (fmt, head_fmt)
    ref = types.SimpleNamespace(spec=model.spec, weights=dequantize_weights(qw), cos_sin=model.cos_sin)
    logits, new_kv = reference_step(ref, before, table, lens, tokens)
    assert int(err) == 0 and int(step.counters.abs().sum()) == 0
    for b in (0, 1):
        torch.testing.assert_close(step.logits[b].float(), logits[b], rtol=1e-4, atol=1e-4)
        assert int(out[b]) == int(logits[b].argmax())
        for i, c in enumerate(caches):
            k, v = kv_at(c, int(table[b, (int(lens[b]) - 1) // PAGE]), (int(lens[b]) - 1) % PAGE)
            torch.testing.assert_close(k.float(), new_kv[i][b][0], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(v.float(), new_kv[i][b][1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind,gemv", [("fp8", "dot"), ("int4", "fma")])
def test_bf16_within_rounding(kind, gemv):
    """bf16 activations: FP8 codes convert to bf16 exactly, int4's q - zero too; the logits within
    bf16 rounding of the float32 reference over the dequantized weights."""
    model = _model(torch.bfloat16)
    qw = _quantized(model, kind)
    caches = paged_caches(model)
    before = [PagedKVCache(c.k.clone(), c.v.clone()) for c in caches]
    lens, tokens = torch.tensor([5, 40, 0], dtype=torch.int32), torch.tensor([3, 150, 7])
    step, table, out, err = _launch(model, qw, caches, lens, tokens, gemv=gemv)
    ref = types.SimpleNamespace(spec=model.spec, weights=dequantize_weights(qw), cos_sin=model.cos_sin)
    logits, _ = reference_step(ref, before, table, lens, tokens)
    assert_bf16_step(step, out, err, logits, rows=(0, 1))


def test_ring_equals_registers_int4():
    """stages > 0 with int4 weights: the ring's chunks (words, group scale, zero) give the register
    form's bits (bf16, multiply-add)."""
    model = _model(torch.bfloat16)
    qw = _quantized(model, "int4")
    lens, tokens = torch.tensor([5, 40], dtype=torch.int32), torch.tensor([3, 150])
    got = []
    for stages in (0, 3):
        caches = paged_caches(model)
        step, _, out, err = _launch(model, qw, caches, lens, tokens, gemv="fma", stages=stages)
        assert int(err) == 0 and step.stages == stages
        got.append((step.logits.clone(), out.clone(), [(c.k.clone(), c.v.clone()) for c in caches]))
    assert torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1])
    assert all(torch.equal(k, k0) and torch.equal(v, v0) for (k, v), (k0, v0) in zip(got[0][2], got[1][2]))


def test_what_is_refused():
    model = _model()
    caches = paged_caches(model)
    w, spec = model.weights, model.spec
    from dataclasses import replace
    block = quantize_weights(w, spec, "block", block=(32, 32))
    assert "FP8 block scales" in unsupported(block, caches, 1)
    with pytest.raises(ValueError, match="block scales"):
        PersistentStep(block, caches, model.cos_sin, geometry=geometry(model), rows=1, eps=1e-5)
    w4 = quantize_weights_int4(w, group_size=32)
    layer = w4.layers[0]
    perm = torch.randperm(128).to(torch.int32)
    act = replace(w4, layers=(replace(layer, qkv=replace(layer.qkv, perm=perm)),) + w4.layers[1:])
    assert "act-order" in unsupported(act, caches, 1)
    mixed = replace(w4, layers=(replace(layer, o=w.layers[0].o),) + w4.layers[1:])
    assert "mix" in unsupported(mixed, caches, 1)
    fp8 = quantize_weights(w, spec, "channel")
    head4 = replace(fp8, lm_head=quantize_int4(w.lm_head, 32))
    assert "lm_head is int4" in unsupported(head4, caches, 1)
    sym = replace(w4, layers=(replace(layer, down=quantize_int4(w.layers[0].down, 32, symmetric=True)),)
                  + w4.layers[1:])
    assert "zero points" in unsupported(sym, caches, 1)
    groups = replace(w4, layers=(replace(layer, down=quantize_int4(w.layers[0].down, 64)),) + w4.layers[1:])
    assert "group sizes" in unsupported(groups, caches, 1)
    kv8 = [PagedKVCache(c.k.to(torch.float8_e4m3fn), c.v.to(torch.float8_e4m3fn), scale=torch.ones(2)) for c in caches]
    assert "kv_caches" in unsupported(fp8, kv8, 1)
    assert unsupported(fp8, caches, 1) is None and unsupported(w4, caches, 16) is None


def test_format_host_pieces():
    model = _model()
    w4 = quantize_weights_int4(model.weights, group_size=64, symmetric=True)
    f = weight_format(w4)
    assert f == WeightFormat(FMT_INT4, FMT_MODEL, group=64, has_zero=False, scale_dtype=torch.float16)
    assert f.chunk_cap == 64 and f.elem_bytes(4) == 0.5 and f.head_elem_bytes(4) == 4
    assert weight_format(model.weights).chunk_cap == NO_CAP
    per_channel = weight_format(quantize_weights_int4(model.weights, group_size=-1))   # K = 128 and 192
    assert per_channel.group == PER_CHANNEL and per_channel.chunk_cap == NO_CAP
    g = geometry(model)
    s = build_schedule(g, 1, 1, elem_bytes=0.5, head_elem_bytes=2)
    down = next(u for u in s.units if u[F_OP] == OP_DOWN)
    head = next(u for u in s.units if u[F_OP] == OP_HEAD)
    assert down[F_WB] == 16 * 192 // 2 and head[F_WB] == 32 * 128 * 2
    for bad in (3, 0, True, "2"):
        with pytest.raises(ValueError, match="elem_bytes"):
            build_schedule(g, 1, 1, elem_bytes=bad)
    with pytest.raises(ValueError, match="head_elem_bytes"):
        build_schedule(g, 1, 1, head_elem_bytes=0.25)
