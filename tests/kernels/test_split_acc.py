"""SplitAcc (graphrt/kernels/splitk.py) read by add_rms_norm (kernels/norm.py): the S strided
partials of every element summed in float32 in the documented order (bit for bit the torch
reference in float32), the FP8 row / column scales after the sum, S = 1 equal to the plain and
ScaledAcc loads, padding rows never read, bad input refused. TRITON_INTERPRET=1 on CPU."""
from __future__ import annotations

import pytest
import torch

from graphrt.kernels.fp8 import ScaledAcc
from graphrt.kernels.norm import add_rms_norm, rms_norm
from graphrt.kernels.splitk import SplitAcc

EPS = 1e-5


def _norm_ref(res: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    r = res.float()
    return r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + EPS) * w.float()


def _split(m, h, s, *, pad=0, scaled=False, col=False, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    acc = (torch.randn(s * m + pad, s * h, generator=g) * 2).to(dtype)
    if pad:
        acc[s * m:] = float("nan")                   # padding rows: never read
    rs = torch.rand(m, generator=g) + 0.5 if scaled else None
    cs = torch.rand(h, generator=g) + 0.5 if col else None
    return SplitAcc(acc, s, m, rs, cs)


@pytest.mark.parametrize("s", [1, 2, 4])
@pytest.mark.parametrize("m,pad", [(1, 15), (3, 4), (16, 0)])
@pytest.mark.parametrize("scaled,col", [(False, False), (True, False), (True, True)])
def test_add_rms_norm_sums_the_split_partials(s, m, pad, scaled, col):
    h = 192
    x = _split(m, h, s, pad=pad, scaled=scaled, col=col)
    g = torch.Generator().manual_seed(1)
    res, w = torch.randn(m, h, generator=g), torch.randn(h, generator=g)
    res0 = res.clone()
    out = add_rms_norm(x, res, w, EPS)
    assert x.shape == (m, h) and out.shape == (m, h)
    assert torch.equal(res, res0 + x.reference())             # same float32 ops, same order
    torch.testing.assert_close(out, _norm_ref(res, w), rtol=1e-5, atol=1e-5)


def test_split_one_is_the_plain_and_scaled_load():
    g = torch.Generator().manual_seed(2)
    acc, w = torch.randn(5, 96, generator=g), torch.randn(96, generator=g)
    rs, cs = torch.rand(5, generator=g) + 0.5, torch.rand(96, generator=g) + 0.5
    res = torch.randn(5, 96, generator=g)
    for a, b in ((acc, SplitAcc(acc, 1, 5)), (ScaledAcc(acc, rs, cs), SplitAcc(acc, 1, 5, rs, cs)),
                 (ScaledAcc(acc, rs, None), SplitAcc(acc, 1, 5, rs))):
        r1, r2 = res.clone(), res.clone()
        assert torch.equal(add_rms_norm(a, r1, w, EPS), add_rms_norm(b, r2, w, EPS))
        assert torch.equal(r1, r2)


@pytest.mark.parametrize("s", [2, 4])
def test_bf16_partials_and_fp8_rows_out(s):
    """bf16 partials (the GEMM's dtype) summed in float32, the residual stored once in bf16; and
    the FP8-rows output mode reads the split form too."""
    m, h = 3, 256
    x = _split(m, h, s, pad=13, scaled=True, col=True, dtype=torch.bfloat16, seed=3)
    g = torch.Generator().manual_seed(4)
    res, w = torch.randn(m, h, generator=g).bfloat16(), torch.randn(h, generator=g).bfloat16()
    res0 = res.clone()
    out = add_rms_norm(x, res, w, EPS)
    want = (res0.float() + x.reference()).bfloat16()
    torch.testing.assert_close(res, want, rtol=1.6e-2, atol=1.6e-2)   # interpreter's bf16 store rounding
    torch.testing.assert_close(out.float(), _norm_ref(res, w), rtol=1.6e-2, atol=1.6e-2)
    rows = add_rms_norm(x, res0.clone(), w, EPS, fp8=True)
    ref = _norm_ref(res, w)
    assert rows.rows == m
    assert float((rows.dequantize() - ref).norm() / ref.norm()) < 0.05    # e4m3 rounding
    assert torch.equal(rms_norm(SplitAcc(x.acc, s, m), w, EPS, out=torch.empty(m, h)),
                       rms_norm(SplitAcc(x.acc, s, m).reference(), w, EPS))


def test_bad_split_acc_is_refused():
    w, res = torch.randn(64), torch.randn(2, 64)
    with pytest.raises(ValueError, match="SplitAcc"):
        add_rms_norm(SplitAcc(torch.randn(4, 64), 2, 2), res, w, EPS)         # 64 != 2 * 64 columns
    with pytest.raises(ValueError, match="SplitAcc"):
        add_rms_norm(SplitAcc(torch.randn(3, 128), 2, 2), res, w, EPS)        # 3 < 2 * 2 rows
    with pytest.raises(ValueError, match="SplitAcc"):
        add_rms_norm(SplitAcc(torch.randn(4, 128), 2, 2, torch.ones(3)), res, w, EPS)
    with pytest.raises(ValueError, match="SplitAcc"):
        add_rms_norm(SplitAcc(torch.randn(4, 128), 2, 2, None, torch.ones(64)), res, w, EPS)
    with pytest.raises(ValueError, match="SplitAcc"):
        add_rms_norm(SplitAcc(torch.randn(128, 4).t(), 2, 2), res, w, EPS)    # column-strided
    with pytest.raises(ValueError, match="residual: 3 rows"):
        add_rms_norm(SplitAcc(torch.randn(4, 128), 2, 2), torch.randn(3, 64), w, EPS)
