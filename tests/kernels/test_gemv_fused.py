"""The GEMV's fused prologues / epilogue (graphrt.kernels.gemv: norm=, silu=, residual=) under
TRITON_INTERPRET=1: against float32 torch references, and against the unfused kernels they
replace (rms_norm / silu_mul before the same GEMV config, add_rms_norm's residual update after):
SiLU-mul and the residual add are bitwise the unfused path's; the RMSNorm prologue is within an
ulp of rms_norm's output (its sum of squares runs in BLOCK_K chunks). M in 1..16, K / N not
multiples of the blocks, float32 and bfloat16."""
from __future__ import annotations

import pytest
import torch

from graphrt.kernels.activation import silu_mul
from graphrt.kernels.gemv import CANDIDATES, gemv
from graphrt.kernels.norm import add_rms_norm, rms_norm

EPS = 1e-5
SHAPES = [(1, 40, 300), (3, 96, 130), (16, 17, 513)]       # (M, N, K): K, N off the blocks
DTYPES = [torch.float32, torch.bfloat16]


def _rand(*shape, g, dtype, scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def _tol(dtype):
    return dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=3e-2)


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_prologue_is_silu_mul_then_gemv(m, n, k, dtype):
    g = torch.Generator().manual_seed(m * 7 + k)
    x, w = _rand(m, 2 * k, g=g, dtype=dtype), _rand(n, k, g=g, dtype=dtype, scale=k ** -0.5)
    cfg = CANDIDATES[m % len(CANDIDATES)]
    out = torch.full((m, n), float("nan"), dtype=dtype)        # poisoned: every element written
    gemv(x, w, config=cfg, silu=True, out=out)
    assert torch.equal(out, gemv(silu_mul(x), w, config=cfg))
    xf = x.double()
    ref = (torch.nn.functional.silu(xf[:, :k]) * xf[:, k:]) @ w.double().T
    torch.testing.assert_close(out.double(), ref, **_tol(dtype))


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
def test_norm_prologue_matches_rms_norm_then_gemv(m, n, k, dtype, bias):
    g = torch.Generator().manual_seed(m * 5 + n)
    x = _rand(m, k, g=g, dtype=dtype, scale=3.0)
    w, gw = _rand(n, k, g=g, dtype=dtype, scale=k ** -0.5), (torch.rand(k, generator=g) + 0.5).to(dtype)
    b = _rand(n, g=g, dtype=dtype) if bias else None
    cfg = CANDIDATES[(m + 1) % len(CANDIDATES)]
    x_before = x.clone()
    out = gemv(x, w, b, config=cfg, norm=gw, eps=EPS)
    assert torch.equal(x, x_before) and out.dtype == dtype and out.shape == (m, n)
    unfused = gemv(rms_norm(x, gw, EPS), w, b, config=cfg)
    if dtype == torch.float32:
        torch.testing.assert_close(out, unfused, rtol=1e-5, atol=1e-5)
    else:                                                    # at most a few bf16 roundings apart
        assert float((out.float() - unfused.float()).abs().max()) <= 2 ** -6 * float(unfused.float().abs().max())
    xf = x.double()
    ref = (xf * torch.rsqrt(xf.pow(2).mean(1, keepdim=True) + EPS) * gw.double()) @ w.double().T
    ref = ref + (b.double() if bias else 0)
    torch.testing.assert_close(out.double(), ref, **_tol(dtype))


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("silu", [False, True])
def test_residual_epilogue_is_add_rms_norm_residual(m, n, k, dtype, silu):
    """o (x [M, K]) and down (silu: x [M, 2K]): residual += round(x @ w.T), in place."""
    g = torch.Generator().manual_seed(m + n + k)
    x = _rand(m, 2 * k if silu else k, g=g, dtype=dtype)
    w, res = _rand(n, k, g=g, dtype=dtype, scale=k ** -0.5), _rand(m, n, g=g, dtype=dtype)
    cfg = CANDIDATES[(m + 2) % len(CANDIDATES)]
    r_fused, r_unfused = res.clone(), res.clone()
    got = gemv(x, w, config=cfg, silu=silu, residual=r_fused)
    assert got is r_fused
    y = gemv(silu_mul(x) if silu else x, w, config=cfg)
    add_rms_norm(y, r_unfused, torch.ones(n, dtype=dtype), EPS)
    assert torch.equal(r_fused, r_unfused)
    xf = x.double()
    act = torch.nn.functional.silu(xf[:, :k]) * xf[:, k:] if silu else xf
    torch.testing.assert_close(r_fused.double(), res.double() + act @ w.double().T, **_tol(dtype))


def test_residual_rows_may_be_strided():
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(2, 64, generator=g), torch.randn(24, 64, generator=g)
    big = torch.randn(2, 40, generator=g)
    before = big.clone()
    res = big[:, 8:32]                                        # row stride 40
    want = res + x @ w.T
    gemv(x, w, residual=res)
    torch.testing.assert_close(res, want, rtol=1e-4, atol=1e-4)
    assert torch.equal(big[:, :8], before[:, :8]) and torch.equal(big[:, 32:], before[:, 32:])


def test_fused_options_reject_bad_input():
    x, w = torch.randn(2, 8), torch.randn(4, 8)
    with pytest.raises(ValueError, match="norm: not taken with silu"):
        gemv(torch.randn(2, 16), w, norm=torch.ones(8), eps=EPS, silu=True)
    with pytest.raises(ValueError, match="norm: expected a contiguous \\[8\\]"):
        gemv(x, w, norm=torch.ones(9), eps=EPS)
    with pytest.raises(ValueError, match="eps=None"):
        gemv(x, w, norm=torch.ones(8))
    with pytest.raises(ValueError, match="x \\[M, 2K\\]"):
        gemv(x, w, silu=True)                                 # 8 columns, not 2 * 8
    with pytest.raises(ValueError, match="out: not taken with residual"):
        gemv(x, w, residual=torch.zeros(2, 4), out=torch.zeros(2, 4))
    with pytest.raises(ValueError, match="residual: expected \\[2, 4\\]"):
        gemv(x, w, residual=torch.zeros(3, 4))
    with pytest.raises(ValueError, match="x: 17 rows"):
        gemv(torch.randn(17, 8), w, norm=torch.ones(8), eps=EPS)
