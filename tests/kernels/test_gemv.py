"""graphrt.kernels.gemv under TRITON_INTERPRET=1 against float32 torch; Linear dispatch."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from graphrt.kernels.gemv import CANDIDATES, gemv
from graphrt.model.linear import Linear


@settings(max_examples=15, deadline=None)
@given(m=st.integers(1, 16), n=st.integers(1, 96), k=st.integers(1, 300),
       cfg=st.sampled_from(CANDIDATES), bias=st.booleans(), seed=st.integers(0, 2**16))
def test_gemv_matches_float32_reference(m, n, k, cfg, bias, seed):
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    out = torch.full((m, n), float("nan"))                       # poisoned: every element written
    gemv(x, w, b, config=cfg, out=out)
    ref = x.double() @ w.double().T + (b.double() if bias else 0)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)


def test_gemv_rejects_bad_shapes():
    with pytest.raises(ValueError, match="x: 17 rows"):
        gemv(torch.randn(17, 8), torch.randn(4, 8))
    with pytest.raises(ValueError, match="w: expected a row-major"):
        gemv(torch.randn(2, 8), torch.randn(8, 4).T)
    with pytest.raises(ValueError, match="bias"):
        gemv(torch.randn(2, 8), torch.randn(4, 8), torch.randn(5))


def test_linear_dispatches_on_rows():
    w, b = torch.randn(24, 40), torch.randn(24)
    lin = Linear(w, b)
    x = torch.randn(3, 40)
    torch.testing.assert_close(lin(x), x @ w.T + b)              # no choice: torch
    lin.choice[3] = CANDIDATES[0]
    torch.testing.assert_close(lin(x), x @ w.T + b, rtol=1e-4, atol=1e-4)
    assert lin.choose([1, 2]) == {}                                 # CPU: nothing to time
