"""Split-K of the o and down GEMMs (graphrt/model/splitk.py): the GEMM of split views read by
add_rms_norm equals the unsplit GEMM's path (float32 within float32 rounding, bf16 and W8A8 FP8
per-tensor / per-channel within their output rounding) for S = 2, 4 at M = 1, 3, 16, and so do
an int4 weight's split-K partials (the int4 GEMV's); K that S cannot split is refused by
split_matmul and falls back to S = 1 in a plan; the plan's settings (argument; GRAPHRT_SPLITK
overrides it through RuntimeOptions); a whole decode step of a small random model with S = 2 / 4
equals S = 1 within float32 rounding (float32, FP8 and int4 weights). CPU, TRITON_INTERPRET=1."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from graphrt import RuntimeConfig
from graphrt.kernels.fp8 import quantize_rows
from graphrt.kernels.norm import add_rms_norm
from graphrt.model import LlamaDecoder
from graphrt.model.linear import fp8_matmul, int4_linear
from graphrt.model.quant import quantize_fp8
from graphrt.model.quant.int4 import Int4Weight, quantize_int4
from graphrt.model.runtime import ModelRuntime
from graphrt.model.splitk import (SplitKPlan, choose_splits, plan_splitk, resolve_setting, split_matmul,
                                  splittable)

EPS = 1e-5
UNIT = torch.ones(())


def _data(m, n, k, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)
    res = torch.randn(m, n, generator=g).to(dtype)
    return x, w, res, (torch.rand(n, generator=g) + 0.5).to(dtype)


def _both(y_split, y_plain, res, norm):
    """add_rms_norm of each -> (residual, out) pairs."""
    r1, r2 = res.clone(), res.clone()
    return (r1, add_rms_norm(y_split, r1, norm, EPS)), (r2, add_rms_norm(y_plain, r2, norm, EPS))


@pytest.mark.parametrize("s", [2, 4])
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float_split_gemm_through_add_rms_norm_equals_unsplit(s, m, dtype):
    x, w, res, norm = _data(m, 96, 256, dtype, seed=m)
    acc = split_matmul(x, w, s)
    assert acc.acc.shape == (s * m, s * 96) and acc.shape == (m, 96) and acc.acc.dtype == dtype
    exact = x.float() @ w.float().T
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(acc.reference(), exact, **tol)
    (r1, o1), (r2, o2) = _both(acc, F.linear(x, w), res, norm)
    torch.testing.assert_close(r1.float(), r2.float(), **tol)
    torch.testing.assert_close(o1.float(), o2.float(), **tol)


@pytest.mark.parametrize("s", [2, 4])
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("strategy", ["tensor", "channel"])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_fp8_split_gemm_through_add_rms_norm_equals_unsplit(s, m, strategy, out_dtype):
    """W8A8: Fp8Rows (data padded to 16 rows) x per-tensor / per-channel Fp8Weight. The split
    view keeps the padded row count a multiple of 16; the scales travel in the SplitAcc."""
    x, w, res, norm = _data(m, 128, 512, seed=10 + m)
    xq, w8 = quantize_rows(x), quantize_fp8(w * 3, strategy)
    acc = split_matmul(xq, w8, s, unit=UNIT, out_dtype=out_dtype)
    assert acc.acc.shape[0] % 16 == 0 and acc.acc.shape[0] >= s * m and acc.acc.shape[1] == s * 128
    assert (acc.col_scale is None) == (strategy == "tensor") and acc.row_scale is xq.scale
    ref = xq.dequantize() @ w8.dequantize().T
    plain = fp8_matmul(xq, w8, unit=UNIT, out_dtype=out_dtype)
    tol = dict(rtol=1e-5, atol=1e-5) if out_dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(acc.reference(), ref, **tol)
    (r1, o1), (r2, o2) = _both(acc, plain, res, norm)
    torch.testing.assert_close(r1, r2, **tol)
    torch.testing.assert_close(o1, o2, **tol)
    rows1, rows2 = (add_rms_norm(a, res.clone(), norm, EPS, fp8=True) for a in (acc, plain))
    diff = (rows1.dequantize() - rows2.dequantize()).abs()
    assert float(diff.max()) <= float(rows2.dequantize().abs().max()) / 8      # at most an e4m3 step


@pytest.mark.parametrize("s", [2, 4])
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_split_gemm_through_add_rms_norm_equals_unsplit(s, m, dtype):
    """The int4 GEMV's split-K partials (group 64, act-order) in the SplitAcc layout, in x's dtype."""
    x, w, res, norm = _data(m, 96, 512, dtype, seed=20 + m)
    w4 = quantize_int4(w.float(), 64)
    w4 = Int4Weight(w4.qweight, w4.scale, 64, w4.zero, torch.randperm(512, generator=torch.Generator().manual_seed(m))
                    .to(torch.int32))
    acc = split_matmul(x, w4, s)
    assert acc.acc.shape == (s * m, s * 96) and acc.shape == (m, 96) and acc.acc.dtype == dtype
    exact = x.float() @ w4.dequantize().T
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(acc.reference(), exact, **tol)
    (r1, o1), (r2, o2) = _both(acc, int4_linear(x, w4), res, norm)
    torch.testing.assert_close(r1.float(), r2.float(), **tol)
    torch.testing.assert_close(o1.float(), o2.float(), **tol)


def test_unsplittable_k_is_refused_and_falls_back():
    x, w, _, _ = _data(2, 64, 96)                          # 96 / 2 = 48 ok, 96 / 4 = 24 not a multiple of 16
    assert splittable(w, 2) and not splittable(w, 4) and splittable(w, 1)
    assert not splittable(w, 5) and not splittable(w.t(), 2)                    # 96 % 5, non-contiguous
    assert not splittable(quantize_fp8(w, "block", block=(32, 32)), 2)
    w4 = quantize_int4(w, 32)                              # group tiles of 32: 96 = 3 x 32 splits in 3 only
    assert splittable(w4, 1) and not splittable(w4, 2) and not splittable(w4, 4)
    assert splittable(quantize_int4(torch.randn(64, 128), 32), 4)
    with pytest.raises(ValueError, match="split: S=2 .* int4"):
        split_matmul(x, w4, 2)
    with pytest.raises(ValueError, match="x: an int4 weight's split GEMM"):
        split_matmul(quantize_rows(torch.randn(2, 128)), quantize_int4(torch.randn(64, 128), 32), 2)
    with pytest.raises(ValueError, match="split: S=4"):
        split_matmul(x, w, 4)
    with pytest.raises(ValueError, match="x: expected a contiguous"):
        split_matmul(torch.randn(96, 2).t(), w, 2)
    with pytest.raises(ValueError, match="Fp8Rows"):
        split_matmul(x, quantize_fp8(w), 2)
    with pytest.raises(ValueError, match="unit"):
        split_matmul(quantize_rows(x), quantize_fp8(w), 2)


def test_settings_and_environment(monkeypatch):
    monkeypatch.setenv("GRAPHRT_SPLITK", "2")                               # read by RuntimeOptions only
    assert resolve_setting("auto") == "auto" and resolve_setting(2) == 2 and resolve_setting("4") == 4
    for bad in (3, True, "two", 8):
        with pytest.raises(ValueError, match="splitk"):
            resolve_setting(bad)


def test_choose_splits_keeps_s1_on_a_tie():
    t = {(1, "o", 1): 13.3, (1, "o", 2): 10.6, (1, "o", 4): 10.5,          # 4 fastest
         (1, "down", 1): 32.4, (1, "down", 2): 32.0, (1, "down", 4): 31.9,  # within MARGIN: 1
         (16, "o", 1): 13.3, (16, "o", 2): 10.8, (16, "o", 4): 11.2,
         (16, "down", 1): 20.3, (16, "down", 2): 17.6}                      # S = 4 not splittable
    assert choose_splits(t) == {1: (4, 1), 16: (2, 2)}
    assert choose_splits({}) == {}


transformers = pytest.importorskip("transformers")


def _hf(inter=256):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=160, hidden_size=128, intermediate_size=inter,
                                   num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                   max_position_embeddings=256, tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(cfg).eval()


def test_plan(monkeypatch):
    monkeypatch.setenv("GRAPHRT_SPLITK", "4")               # the plan reads its setting only
    model = LlamaDecoder.from_hf(_hf(inter=224))             # down K = 224: S = 2 (112), not 4 (56)
    assert plan_splitk(model, [1, 2, 128]) == SplitKPlan()  # CPU "auto": off
    assert plan_splitk(model, [1, 2, 128], 1).table == {}
    p2, p4 = plan_splitk(model, [1, 2, 128], 2), plan_splitk(model, [1, 64, 65], 4)
    assert p2.source == "fixed" and p2.table == {1: (2, 2), 2: (2, 2)}      # 128 > MAX_ROWS: S = 1
    assert p4.table == {1: (4, 1), 64: (4, 1)} and p4.get(65) == (1, 1)


def _logits(model, splitk, steps=3):
    """Prefill then `steps` decode steps' float32 logits [steps, B, V] (fixed token feed)."""
    cfg = RuntimeConfig(num_qo_heads=2, num_kv_heads=1, head_dim=64, page_size=16, max_context_len=64,
                        buckets=[1, 3], dtype="float32", backend="torch", kv_pool_pages=16)
    mrt = ModelRuntime(model, cfg, "cpu", keep_logits=True, splitk=splitk)
    prompts = [torch.arange(5) * 7 % 160, torch.arange(11) * 3 % 160, torch.arange(3) + 9]
    table = torch.arange(12, dtype=torch.int32).view(3, 4)
    mrt.prefill(prompts, table)
    lens = torch.tensor([len(p) for p in prompts], dtype=torch.int32)
    gen, out = torch.Generator().manual_seed(1), []
    for _ in range(steps):
        lens += 1
        mrt.decode(torch.randint(0, 160, (3,), generator=gen), table, lens)
        out.append(mrt.last_logits(3).clone())
    return torch.stack(out), mrt.splitk


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["float32", "channel", "tensor", "int4"])
def test_decode_step_split_equals_unsplit(weights, monkeypatch):
    monkeypatch.delenv("GRAPHRT_SPLITK", raising=False)
    from graphrt.model.fp8_weights import quantize_weights
    from graphrt.model.int4_weights import quantize_weights_int4
    hf = _hf()
    model = LlamaDecoder.from_hf(hf, kernels="triton")      # add+RMSNorm's Triton kernel sums the partials
    if weights == "int4":                                    # unsplit: float32 over the dequantized weight
        model = LlamaDecoder(model.spec, quantize_weights_int4(model.weights, group_size=32), kernels="triton")
    elif weights != "float32":
        model = LlamaDecoder(model.spec, quantize_weights(model.weights, model.spec, weights))
    ref, plan1 = _logits(model, 1)
    assert plan1.table == {}
    for s in (2, 4):
        got, plan = _logits(model, s)
        assert plan.table == {1: (s, s), 3: (s, s)}
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        assert float((got - ref).abs().max()) < 1e-4 * float(ref.abs().max())


def test_decode_step_refuses_bad_splitk():
    model = LlamaDecoder.from_hf(_hf(inter=224))
    for bad in ((4, 4), (2,), [2, 2], (0, 1), (2, True)):
        with pytest.raises(ValueError, match="splitk"):
            model.decode_step(None, torch.zeros(1, dtype=torch.long), splitk=bad)
    with pytest.raises(ValueError, match="splitk"):
        ModelRuntime(model, RuntimeConfig(num_qo_heads=2, num_kv_heads=1, head_dim=64, page_size=16,
                                          max_context_len=64, buckets=[1], dtype="float32",
                                          backend="torch-splitkv", kv_pool_pages=4), "cpu", splitk=3)
