"""RMSNorm and fused residual-add + RMSNorm kernels vs a float32 torch reference (TRITON_INTERPRET=1)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from graphrt.kernels.norm import add_rms_norm, rms_norm

EPS = 1e-5


def _ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w.float()


def _tol(dtype):
    # bf16: within 2 ulp (the interpreter rounds float32 -> bf16 toward zero, the GPU to nearest)
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1.6e-2)


@settings(max_examples=25, deadline=None)
@given(t=st.sampled_from([1, 3, 5, 9]), h=st.sampled_from([1, 7, 64, 100, 128, 257, 1000, 2048]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), add=st.booleans(),
       pad=st.sampled_from([0, 3]), seed=st.integers(0, 2**16))
def test_matches_float32_reference(t, h, dtype, add, pad, seed):
    gen = torch.Generator().manual_seed(seed)
    big = (torch.randn(t, h + pad, generator=gen) * 3).to(dtype)
    x = big[:, :h]                                  # strided rows
    w = torch.randn(h, generator=gen).to(dtype)
    if add:
        res = torch.randn(t, h, generator=gen).to(dtype)
        before = res.clone()
        out = add_rms_norm(x, res, w, EPS)
        want_res = (x.float() + before.float()).to(dtype)
        torch.testing.assert_close(res, want_res, **_tol(dtype))  # one rounding of the sum
        want = _ref(res, w)                         # the stored residual is what gets normed
    else:
        out = rms_norm(x, w, EPS)
        want = _ref(x, w)
        assert torch.equal(big[:, :h], x)           # input untouched
    assert out.dtype == dtype and out.shape == (t, h)
    torch.testing.assert_close(out.float(), want, **_tol(dtype))


def test_out_argument_and_dtype_conversion():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    w = torch.randn(64)
    out = torch.empty(4, 64)
    assert rms_norm(x, w, EPS, out=out) is out
    torch.testing.assert_close(out, _ref(x, w), rtol=1e-5, atol=1e-5)


def test_bad_input_names_the_field():
    x, w = torch.randn(3, 64), torch.randn(64)
    with pytest.raises(ValueError, match="x: expected"):
        rms_norm(torch.randn(3, 32), w, EPS)
    with pytest.raises(ValueError, match="weight"):
        rms_norm(x, torch.randn(2, 32), EPS)
    with pytest.raises(ValueError, match="residual: 2 rows"):
        add_rms_norm(x, torch.randn(2, 64), w, EPS)
    with pytest.raises(ValueError, match="x: expected"):
        rms_norm(torch.randn(64, 3).t(), w[:3], EPS)   # column-strided
