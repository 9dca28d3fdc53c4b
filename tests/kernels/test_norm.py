"""RMSNorm and fused residual-add + RMSNorm kernels vs a float32 torch reference (TRITON_INTERPRET=1)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from graphrt.kernels.norm import add_rms_norm, embed_rms_norm, rms_norm
from graphrt.kernels.reference import rms_norm_f32

EPS = 1e-5


def _ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return rms_norm_f32(x, w, EPS)                   # the torch kernel set's (kernels/reference.py)


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("id_dtype", [torch.int64, torch.int32])
def test_embed_rms_norm_is_the_gather_then_the_norm(dtype, id_dtype):
    """The same values as table[ids.clamp_min(0)] then rms_norm, bit for bit (the same row is
    loaded): negative ids (padding) read row 0; ids from a strided column (a proposals table);
    output rows may be strided (the first half of the EAGLE-3 head's [T, 2H] input)."""
    gen = torch.Generator().manual_seed(7)
    table = (torch.randn(50, 96, generator=gen) * 2).to(dtype)
    w = torch.randn(96, generator=gen).to(dtype)
    grid = torch.randint(-1, 50, (6, 3), generator=gen).to(id_dtype)
    grid[2, 1] = -1
    for ids in (grid[:, 1], grid.reshape(-1), grid[:1, 0]):
        want = rms_norm(table[ids.long().clamp_min(0)], w, EPS)
        wide = torch.full((ids.shape[0], 2 * 96), 3.0, dtype=dtype)
        got = embed_rms_norm(table, ids, w, EPS, out=wide[:, :96])
        assert got.data_ptr() == wide.data_ptr() and torch.equal(got, want)
        assert (wide[:, 96:] == 3.0).all()
        assert torch.equal(embed_rms_norm(table, ids, w, EPS), want)
    assert embed_rms_norm(table, torch.empty(0, dtype=torch.int64), w, EPS).shape == (0, 96)


def test_embed_rms_norm_names_the_bad_field():
    table, w = torch.randn(10, 64), torch.randn(64)
    ids = torch.tensor([1, 2])
    with pytest.raises(ValueError, match="^ids: "):
        embed_rms_norm(table, ids.float(), w, EPS)
    with pytest.raises(ValueError, match="^ids: "):
        embed_rms_norm(table, ids[:, None], w, EPS)
    with pytest.raises(ValueError, match="^table: "):
        embed_rms_norm(torch.randn(10, 32), ids, w, EPS)
    with pytest.raises(ValueError, match="^out: 3 rows"):
        embed_rms_norm(table, ids, w, EPS, out=torch.empty(3, 64))
    with pytest.raises(ValueError, match="^weight: "):
        embed_rms_norm(table, ids, w[None], EPS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_residual_and_copy_outputs(dtype):
    """embed_rms_norm's residual / copy_to receive the gathered rows; add_rms_norm's copy_to the
    new residual as stored (a decoder's recorded state, into a strided column block); the
    normed output unchanged by either."""
    gen = torch.Generator().manual_seed(3)
    table = torch.randn(30, 64, generator=gen).to(dtype)
    w = torch.randn(64, generator=gen).to(dtype)
    ids = torch.tensor([4, -1, 29, 4])
    res = torch.empty(4, 64, dtype=dtype)
    record = torch.zeros(4, 3 * 64, dtype=dtype)
    out = embed_rms_norm(table, ids, w, EPS, residual=res, copy_to=record[:, 64:128])
    assert torch.equal(res, table[ids.clamp_min(0)]) and torch.equal(record[:, 64:128], res)
    assert torch.equal(out, rms_norm(res, w, EPS)) and (record[:, :64] == 0).all()
    x = torch.randn(4, 64, generator=gen).to(dtype)
    plain = res.clone()
    want = add_rms_norm(x, plain, w, EPS)
    got = add_rms_norm(x, res, w, EPS, copy_to=record[:, 128:])
    assert torch.equal(got, want) and torch.equal(res, plain) and torch.equal(record[:, 128:], plain)
    with pytest.raises(ValueError, match="^copy_to: 3 rows"):
        add_rms_norm(x, res, w, EPS, copy_to=record[:3, :64])
