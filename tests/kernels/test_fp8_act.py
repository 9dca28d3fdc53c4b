"""FP8 activation kernels (graphrt/kernels/fp8.py and the FP8 modes of norm / activation /
rope_append) against float32 torch: per-row e4m3 quantization is bit-exact with torch's
round-to-nearest-even conversion (on CPU too: the kernels round in float32 before the cast),
scales are exact, ScaledAcc inputs are scaled as they load. TRITON_INTERPRET=1 on CPU; the
gpu-marked copies run the same checks on CUDA tensors."""
from __future__ import annotations

import pytest
import torch

from graphrt.kernels.activation import silu_mul
from graphrt.kernels.fp8 import FP8, Fp8Rows, ScaledAcc, apply_scales, padded_rows, quantize_rows
from graphrt.kernels.norm import add_rms_norm, rms_norm

EPS = 1e-5
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _ref_quant(x: torch.Tensor):
    """float32 [M, K] -> (e4m3 [M, K], scale [M]) as torch computes them."""
    s = (x.abs().amax(1) / 448.0).clamp(min=1e-12)
    return (x / s[:, None]).clamp(-448.0, 448.0).to(FP8), s


def _assert_rows(got: Fp8Rows, x: torch.Tensor, *, exact: bool = False):
    """got quantizes float32 x per row: scales exact; codes equal torch's (exact=True: the
    kernel quantized x itself), else equal but for rare neighbours (the kernel quantized its own
    float32 x, which differs from torch's by rounding)."""
    q, s = _ref_quant(x.float().cpu())
    assert isinstance(got, Fp8Rows) and got.rows == x.shape[0]
    assert got.data.shape == (padded_rows(x.shape[0]), x.shape[1]) and got.data.dtype == FP8
    torch.testing.assert_close(got.scale.cpu(), s, rtol=1e-6, atol=0)
    a, b = got.data[: x.shape[0]].cpu().float(), q.float()
    differ = a != b
    if exact:
        assert not bool(differ.any()), int(differ.sum())
    else:
        assert float(differ.float().mean()) < 0.01
        assert bool(((a - b).abs() <= torch.maximum(a.abs(), b.abs()) / 8 + 2 ** -9).all())
    deq = got.dequantize().cpu()
    assert float((deq - x.float().cpu()).abs().max()) <= float(s.max()) * 16 + 1e-12


def _rand(*shape, device, scale=3.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * scale
    x[0, :7] = torch.tensor([0.0, 1e-9, -2e-3, 447.9, -500.0, 5e-2, 127.6])   # subnormals, carries
    return x.to(device)


@pytest.mark.parametrize("device", DEVICES)
def test_quantize_rows_is_torch_rne(device):
    x = _rand(5, 300, device=device)
    x[3] = 0.0                                                   # an all-zero row: scale floor
    got = quantize_rows(x)
    _assert_rows(got, x, exact=True)
    assert float(got.scale[3]) == pytest.approx(1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_rms_norm_fp8_out(device):
    x, w = _rand(3, 256, device=device), _rand(1, 256, device=device, seed=1)[0]
    ref = x.float() * torch.rsqrt(x.float().pow(2).mean(1, keepdim=True) + EPS) * w.float()
    _assert_rows(rms_norm(x, w, EPS, fp8=True), ref)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8,col", [(False, True), (True, True), (True, False)])
def test_add_rms_norm_reads_scaled_acc(device, fp8, col):
    t, h = 4, 192
    acc = _rand(t, h, device=device)
    rs, cs = torch.rand(t, device=device) + 0.1, torch.rand(h, device=device) + 0.1
    cs = cs if col else None
    res = _rand(t, h, device=device, seed=2)
    res0 = res.clone()
    out = add_rms_norm(ScaledAcc(acc, rs, cs), res, _rand(1, h, device=device, seed=3)[0], EPS, fp8=fp8)
    want_res = res0 + ScaledAcc(acc, rs, cs).reference()
    torch.testing.assert_close(res, want_res, rtol=1e-6, atol=1e-5)
    w = _rand(1, h, device=device, seed=3)[0]
    ref = want_res * torch.rsqrt(want_res.pow(2).mean(1, keepdim=True) + EPS) * w
    if fp8:
        _assert_rows(out, ref)
    else:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8,col,i", [(False, True, 700), (True, True, 700), (True, False, 4100)])
def test_silu_mul_reads_scaled_acc(device, fp8, col, i):
    """FP8 output at I = 4100: two tiles of the row, the second one masked."""
    t = 3
    acc = _rand(t, 2 * i, device=device, scale=1.5)
    rs, cs = torch.rand(t, device=device) + 0.1, torch.rand(2 * i, device=device) + 0.1
    cs = cs if col else None
    x = ScaledAcc(acc, rs, cs).reference()
    ref = torch.nn.functional.silu(x[:, :i]) * x[:, i:]
    out = silu_mul(ScaledAcc(acc, rs, cs), fp8=fp8)
    if fp8:
        _assert_rows(out, ref)
    else:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    if fp8:
        _assert_rows(silu_mul(x, fp8=True), ref)                # plain float input too


@pytest.mark.parametrize("device", DEVICES)
def test_apply_scales_with_bias(device):
    m, n = 3, 5000
    acc = _rand(m, n, device=device)
    rs, cs, b = torch.rand(m, device=device), torch.rand(n, device=device), _rand(1, n, device=device)[0]
    for a in (ScaledAcc(acc, rs, cs, b), ScaledAcc(acc, rs, None, b)):
        torch.testing.assert_close(apply_scales(a), a.reference(), rtol=1e-6, atol=1e-5)
    out = torch.full((m, n), float("nan"), device=device)
    assert apply_scales(ScaledAcc(acc, rs, cs), out=out) is out
    torch.testing.assert_close(out, acc * rs[:, None] * cs[None, :], rtol=1e-6, atol=1e-5)


def test_fp8_mode_refusals():
    x, w = torch.randn(2, 64), torch.ones(64)
    with pytest.raises(ValueError, match="out: not taken"):
        rms_norm(x, w, EPS, out=torch.empty(2, 64), fp8=True)
    with pytest.raises(ValueError, match="x: expected a ScaledAcc"):
        add_rms_norm(ScaledAcc(x, torch.ones(3), torch.ones(64)), x.clone(), w, EPS)
    with pytest.raises(ValueError, match="bias"):
        silu_mul(ScaledAcc(x, torch.ones(2), torch.ones(64), torch.ones(64)))
    with pytest.raises(ValueError, match="x: expected a floating"):
        quantize_rows(torch.ones(2, 3, dtype=torch.int32))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("col", [True, False])
def test_rope_append_reads_scaled_acc_with_bias(device, col):
    """rope_append over a ScaledAcc (+ bias) equals rope_append over the scaled float qkv."""
    from graphrt.attention.kvcache import PagedKVCache
    from graphrt.kernels.rope_append import rope_append_decode
    hq, hkv, d, page, b = 4, 2, 64, 16, 3
    n = (hq + 2 * hkv) * d
    acc = _rand(b, n, device=device, scale=1.0)
    rs, cs, bias = torch.rand(b, device=device) + 0.5, torch.rand(n, device=device) + 0.5, \
        _rand(1, n, device=device, seed=4)[0]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    ang = torch.arange(64).float()[:, None] * inv[None]
    cos_sin = torch.cat([ang.cos(), ang.sin()], dim=1).contiguous().to(device)
    table = torch.tensor([[2, 0], [1, 3], [4, 5]], dtype=torch.int32, device=device)
    lens = torch.tensor([3, 20, 1], dtype=torch.int32, device=device)
    outs = []
    cs = cs if col else None
    for qkv in (ScaledAcc(acc, rs, cs, bias), ScaledAcc(acc, rs, cs, bias).reference()):
        cache = PagedKVCache(torch.zeros(6, page, hkv, d, device=device),
                             torch.zeros(6, page, hkv, d, device=device), "NHD")
        err = torch.zeros(1, dtype=torch.int32, device=device)
        q = rope_append_decode(qkv, cos_sin, cache, table, lens, err, num_q_heads=hq)
        assert int(err) == 0
        outs.append((q, cache.k, cache.v))
    assert bool((outs[1][1] != 0).any())
    for got, ref in zip(*outs):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
