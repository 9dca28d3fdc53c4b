"""SiLU-and-mul kernel vs a float32 torch reference (TRITON_INTERPRET=1)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from graphrt.kernels import reference as ref
from graphrt.kernels.activation import silu_mul


@settings(max_examples=20, deadline=None)
@given(t=st.sampled_from([1, 3, 7]), i=st.sampled_from([1, 5, 64, 1000, 1500, 2304]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), seed=st.integers(0, 2**16))
def test_matches_float32_reference(t, i, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(t, 2 * i, generator=gen) * 4).to(dtype)
    out = silu_mul(x)
    want = ref.silu_mul(x.float())                 # the torch kernel set's (kernels/reference.py)
    assert out.dtype == dtype and out.shape == (t, i)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(out.float(), want, **tol)


def test_strided_rows_and_out():
    big = torch.randn(3, 2 * 40 + 8)
    out = torch.empty(3, 40)
    assert silu_mul(big[:, :80], out=out) is out
    torch.testing.assert_close(out, F.silu(big[:, :40]) * big[:, 40:80])


def test_bad_input_names_the_field():
    with pytest.raises(ValueError, match="x: expected"):
        silu_mul(torch.randn(3, 7))
    with pytest.raises(ValueError, match="out: expected"):
        silu_mul(torch.randn(3, 8), out=torch.empty(3, 3))
