"""graphrt.kernels.gemv.gemv_fp8 under TRITON_INTERPRET=1 against float64 torch over the
dequantized weight (per-channel and block scales, bias, M over one tile); GPU: the FP8 paths of
`linear` against the same reference."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from graphrt.kernels.gemv import FP8_CANDIDATES, GemvConfig, gemv_fp8
from graphrt.model.quant import FP8, quantize_fp8


def _ref(x, w8, b):
    return x.double() @ w8.dequantize().double().T + (b.double() if b is not None else 0)


@settings(max_examples=12, deadline=None)
@given(m=st.integers(1, 20), n=st.integers(1, 80), k=st.integers(1, 300),
       cfg=st.sampled_from(FP8_CANDIDATES), blockwise=st.booleans(), bias=st.booleans(),
       seed=st.integers(0, 2**16))
def test_gemv_fp8_matches_float_reference(m, n, k, cfg, blockwise, bias, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    block = (32, 512) if blockwise else None
    w8 = quantize_fp8(torch.randn(n, k, generator=g) * 0.3, "block" if blockwise else "channel",
                      block=block or (128, 128))
    b = torch.randn(n, generator=g) if bias else None
    out = torch.full((m, n), float("nan"))                       # poisoned: every element written
    gemv_fp8(x, w8.data, w8.scale, b, block=w8.block, config=cfg, out=out)
    torch.testing.assert_close(out.double(), _ref(x, w8, b), rtol=1e-4, atol=1e-4)


def test_gemv_fp8_rejects_bad_input():
    x, w8 = torch.randn(2, 64), quantize_fp8(torch.randn(8, 64))
    with pytest.raises(ValueError, match="w: expected torch.float8_e4m3fn"):
        gemv_fp8(x, w8.dequantize(), w8.scale)
    with pytest.raises(ValueError, match=r"scale: expected contiguous float32 \(8,\)"):
        gemv_fp8(x, w8.data, w8.scale[:4])
    with pytest.raises(ValueError, match="w: expected a row-major"):
        gemv_fp8(torch.randn(2, 8), torch.zeros(8, 64, dtype=FP8).T, w8.scale)
    wb = quantize_fp8(torch.randn(8, 64), "block", block=(4, 64))
    with pytest.raises(ValueError, match="config: block_k=128 must divide"):
        gemv_fp8(x, wb.data, wb.scale, block=wb.block, config=GemvConfig(16, 128, 4, 4))
    with pytest.raises(ValueError, match="bias"):
        gemv_fp8(x, w8.data, w8.scale, torch.randn(9))


@pytest.mark.parametrize("m", [5, 32])
def test_scaled_mm_per_token_close_to_weight_only(m):
    """W8A8 path (per-token e4m3 activations, row-wise scales); runs wherever torch._scaled_mm
    does (CUDA; recent CPU builds). Rows padded to 16 when m % 16."""
    from graphrt.model.linear import scaled_mm_per_token
    g = torch.Generator().manual_seed(m)
    w8 = quantize_fp8(torch.randn(48, 128, generator=g) * 0.05)
    x, b = torch.randn(m, 128, generator=g).bfloat16(), torch.randn(48, generator=g).bfloat16()
    try:
        y = scaled_mm_per_token(x, w8, b)
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"torch._scaled_mm unavailable here: {e}")
    ref = _ref(x.float(), w8, b.float())
    assert y.shape == (m, 48) and y.dtype == torch.bfloat16
    assert float((y.double() - ref).norm() / ref.norm()) < 0.05


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 4, 16, 64])
@pytest.mark.parametrize("strategy", ["channel", "block"])
def test_fp8_linear_on_gpu(m, strategy):
    from graphrt.model.linear import Linear, fp8_linear
    g = torch.Generator().manual_seed(m)
    w8 = quantize_fp8(torch.randn(384, 512, generator=g) * 0.05, strategy).to("cuda")
    x = torch.randn(m, 512, generator=g).to("cuda", torch.bfloat16)
    ref = (x.double() @ w8.dequantize().double().T)
    y = fp8_linear(x, w8)
    assert y.dtype == torch.bfloat16
    # per-token activation quantization (m > 16, per-channel) adds e4m3 rounding of x
    tol = 0.08 if (m > 16 and strategy == "channel") else 0.02
    assert float((y.double() - ref).norm() / ref.norm()) < tol
    lin = Linear(w8)
    names = lin.choose([m])
    if m <= 16:
        assert m in names
        assert float((lin(x).double() - ref).norm() / ref.norm()) < 0.08
