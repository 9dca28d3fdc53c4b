"""graphrt/kernels/gemv_int4.py under TRITON_INTERPRET: the W4A16 GEMV, its split-K partials and
the dequantize kernel against float32 torch over the dequantized weight (Int4Weight.dequantize:
codes unpacked by torch ops, not by the kernel's helper), every group size, symmetric /
asymmetric, act-order, bias, split-K, K steps that do not divide K, one row and M tiles; the
default configuration's choice; bad arguments named."""
from __future__ import annotations

import pytest
import torch

from graphrt.kernels.gemv_int4 import (CANDIDATES, SMS, Int4GemvConfig, default_config, dequantize_int4,
                                       gemv_int4, gemv_int4_partial, tile_k)
from graphrt.kernels.splitk import SplitAcc
from graphrt.model.quant.int4 import Int4Weight, from_codes, quantize_int4


def _weight(n, k, group, sym, perm=False, seed=0) -> Int4Weight:
    g = torch.Generator().manual_seed(seed)
    if group not in (32, 64, 128, -1):       # a group size RTN does not make: codes, scales, zeros drawn
        gs = k // group
        w4 = from_codes(torch.randint(0, 16, (n, k), generator=g), torch.rand(n, gs, generator=g).half(), group,
                        zero=None if sym else torch.randint(0, 17, (n, gs), generator=g))
    else:
        w4 = quantize_int4(torch.randn(n, k, generator=g), group, symmetric=sym)
    if perm:
        w4 = Int4Weight(w4.qweight, w4.scale, w4.group_size, w4.zero,
                        torch.randperm(k, generator=g).to(torch.int32))
    return w4


@pytest.mark.parametrize("n,k,group,sym,perm,m,cfg,dtype", [
    (48, 256, 32, False, False, 3, Int4GemvConfig(16, 128, 4, 1), torch.float32),       # 4 group tiles a step
    (40, 512, 64, True, True, 1, Int4GemvConfig(16, 256, 4, 1, 2), torch.float32),      # one row, split 2
    (64, 384, 128, False, True, 17, Int4GemvConfig(32, 256, 4, 1), torch.bfloat16),     # 1.5 steps, 2 M tiles
    (32, 128, -1, True, False, 5, Int4GemvConfig(16, 128, 4, 1), torch.float16),        # per channel
    (24, 512, 128, False, False, 20, Int4GemvConfig(16, 128, 4, 1, 4), torch.float32),  # split 4, M tiles
    (40, 768, 256, False, False, 1, Int4GemvConfig(16, 512, 4, 1), torch.bfloat16),     # 2 tiles a group
])
def test_gemv_int4_matches_float32(n, k, group, sym, perm, m, cfg, dtype):
    w4 = _weight(n, k, group, sym, perm)
    x = torch.randn(m, k).to(dtype)
    bias = torch.randn(n).to(dtype) if m % 2 else None
    ref = x.float() @ w4.dequantize().T + (0 if bias is None else bias.float())
    y = gemv_int4(x, w4.qweight, w4.scale, w4.group_size, zero=w4.zero, perm=w4.perm, bias=bias, config=cfg)
    assert y.dtype == dtype and y.shape == (m, n)
    # float32: exact up to summation order; half types: the output's rounding
    tol = 1e-4 if dtype == torch.float32 else 2 ** -7
    torch.testing.assert_close(y.float(), ref, rtol=tol, atol=tol * float(ref.abs().max()))


def test_gemv_int4_partial_is_a_split_acc():
    w4 = _weight(40, 512, 64, False, perm=True)
    x = torch.randn(3, 512)
    cfg = Int4GemvConfig(16, 128, 4, 1, 2)
    acc = torch.full((2 * 3 + 1, 2 * 40), float("nan"))          # one padding row, never read
    gemv_int4_partial(x, w4.qweight, w4.scale, 64, acc, zero=w4.zero, perm=w4.perm, config=cfg)
    got = SplitAcc(acc, 2, 3).reference()
    torch.testing.assert_close(got, x @ w4.dequantize().T, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match=r"acc: expected float32 or torch.float32 \[>= 6, 80\]"):
        gemv_int4_partial(x, w4.qweight, w4.scale, 64, acc[:5], zero=w4.zero, perm=w4.perm, config=cfg)


def test_gemv_int4_default_config_and_out():
    w4 = _weight(40, 256, 64, False)
    x = torch.randn(2, 256)
    out = torch.empty(2, 40)
    y = gemv_int4(x, w4.qweight, w4.scale, 64, zero=w4.zero, out=out)
    assert y is out
    torch.testing.assert_close(y, x @ w4.dequantize().T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("group,sym", [(32, True), (128, False), (-1, False)])
def test_dequantize_int4_kernel(group, sym):
    w4 = _weight(40, 256, group, sym)
    got = dequantize_int4(w4.qweight, w4.scale, w4.group_size, zero=w4.zero, dtype=torch.float32)
    assert torch.equal(got, w4.dequantize(torch.float32))
    # bf16: one rounding of the float32 value (the CPU interpreter truncates: within one ulp)
    got = dequantize_int4(w4.qweight, w4.scale, w4.group_size, zero=w4.zero, dtype=torch.bfloat16)
    torch.testing.assert_close(got.float(), w4.dequantize(torch.float32), rtol=2 ** -7, atol=0)


def test_default_config_is_a_pure_choice():
    assert tile_k(32) == 32 and tile_k(4096) == 128 and tile_k(96) == 32
    big = default_config(28672, 4096, 128)             # 8B gate_up: 896 programs of 32 rows
    assert (big.block_n, big.split_k) == (32, 1)
    assert (default_config(28672, 4096, 128, 16).block_n, default_config(28672, 4096, 128, 16).block_k) == (16, 256)
    o = default_config(4096, 4096, 128)                 # 8B o: 256 programs of 16 rows
    assert (o.block_n, o.block_k, o.num_warps, o.split_k) == (16, 512, 4, 1)
    assert default_config(2048, 2048, 128).block_k == 1024     # 1B o: 128 programs, a longer K step each
    assert default_config(4096, 14336, 128).block_k == 1024    # 8B down: long K
    assert default_config(4096, 14336, 128, 16).block_n == 32  # 16 rows, long K: 32 rows a program
    assert default_config(4096, 4096, 128, 16).block_k == 512      # 16 rows: a smaller x tile a step
    assert default_config(2048, 8192, 128).split_k == 1        # 1B down: 128 programs, K parallel inside
    assert default_config(1024, 4096, 128).split_k == 2        # 64 programs: split
    assert default_config(576, 1536, 64).split_k == 1          # 36 programs, but K too short to split
    for n, k, g in ((4096, 4096, 128), (28672, 4096, 128), (576, 1536, 64), (4096, 14336, 14336)):
        assert default_config(n, k, g).fits(k, g) and default_config(n, k, g, 16).fits(k, g)
    assert all(c.fits(4096, 128) for c in CANDIDATES) and len(set(CANDIDATES)) == len(CANDIDATES)
    assert SMS > 0 and not Int4GemvConfig(16, 128, 4, 1, 3).fits(4096, 128)


def test_bad_arguments_are_named():
    w4 = _weight(16, 128, 32, False)
    x = torch.randn(1, 128)
    args = (w4.qweight, w4.scale, 32)
    with pytest.raises(ValueError, match="x: expected a floating \\[M, 128\\]"):
        gemv_int4(torch.randn(1, 64), *args)
    with pytest.raises(ValueError, match="x: 0 rows"):
        gemv_int4(torch.randn(0, 128), *args)
    with pytest.raises(ValueError, match="qweight: expected a row-major int32"):
        gemv_int4(x, w4.qweight.float(), w4.scale, 32)
    with pytest.raises(ValueError, match="group_size: 48"):
        gemv_int4(x, w4.qweight, w4.scale, 48)
    with pytest.raises(ValueError, match="group_size: 8 must be a positive multiple of 16"):
        gemv_int4(x, w4.qweight, w4.scale, 8)
    with pytest.raises(ValueError, match="scale: expected a floating \\[16, 4\\]"):
        gemv_int4(x, w4.qweight, w4.scale[:, :2], 32)
    with pytest.raises(ValueError, match="zero: expected uint8"):
        gemv_int4(x, *args, zero=w4.zero.int())
    with pytest.raises(ValueError, match="perm: expected contiguous int32 \\[128\\]"):
        gemv_int4(x, *args, perm=torch.arange(128))
    with pytest.raises(ValueError, match="bias: expected \\[16\\]"):
        gemv_int4(x, *args, bias=torch.zeros(8))
    with pytest.raises(ValueError, match="config: .*block_k >= 128"):
        gemv_int4(x, *args, config=Int4GemvConfig(16, 64, 4, 1))
    with pytest.raises(ValueError, match="config: .*powers of two block_n >= 16"):
        gemv_int4(x, *args, config=Int4GemvConfig(24, 128, 4, 1))
    with pytest.raises(ValueError, match="config: split_k=3 needs K=128 divisible by split_k x 32"):
        gemv_int4(x, *args, config=Int4GemvConfig(16, 128, 4, 1, 3))
    with pytest.raises(ValueError, match="out: expected \\[1, 16\\]"):
        gemv_int4(x, *args, out=torch.empty(2, 16))
