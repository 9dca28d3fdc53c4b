"""graphrt/kernels/gemv_int4.py under TRITON_INTERPRET: the W4A16 GEMV and the dequantize kernel
against float32 torch over the dequantized weight (Int4Weight.dequantize: codes unpacked by
torch ops, not by the kernel's helper), every group size, symmetric / asymmetric, act-order,
bias, split-K, M tiles; bad arguments named."""
from __future__ import annotations

import pytest
import torch

from graphrt.kernels.gemv_int4 import (Int4GemvConfig, TARGET_PROGRAMS, default_config, dequantize_int4,
                                       gemv_int4, tile_k)
from graphrt.model.quant.int4 import Int4Weight, quantize_int4


def _weight(n, k, group, sym, perm=False, seed=0) -> Int4Weight:
    g = torch.Generator().manual_seed(seed)
    w4 = quantize_int4(torch.randn(n, k, generator=g), group, symmetric=sym)
    if perm:
        w4 = Int4Weight(w4.qweight, w4.scale, w4.group_size, w4.zero,
                        torch.randperm(k, generator=g).to(torch.int32))
    return w4


@pytest.mark.parametrize("n,k,group,sym,perm,m,split,dtype,bm", [
    (48, 256, 32, False, False, 3, 1, torch.float32, 16),
    (40, 256, 64, True, True, 1, 2, torch.float32, 16),
    (64, 256, 128, False, True, 16, 1, torch.bfloat16, 16),
    (32, 128, -1, True, False, 5, 1, torch.float16, 16),
    (24, 512, 128, False, False, 20, 4, torch.float32, 16),     # two M tiles, split-K 4
    (40, 256, 64, False, True, 1, 1, torch.bfloat16, 1),        # FMA path, one row a program
    (24, 256, 32, True, False, 6, 2, torch.float32, 4),         # FMA path, two M tiles of 4, split 2
])
def test_gemv_int4_matches_float32(n, k, group, sym, perm, m, split, dtype, bm):
    w4 = _weight(n, k, group, sym, perm)
    x = torch.randn(m, k).to(dtype)
    bias = torch.randn(n).to(dtype) if m % 2 else None
    ref = x.float() @ w4.dequantize().T + (0 if bias is None else bias.float())
    cfg = Int4GemvConfig(16, tile_k(w4.group_size) // (2 if group == 32 else 1) or 16, 4, 1, split, bm)
    y = gemv_int4(x, w4.qweight, w4.scale, w4.group_size, zero=w4.zero, perm=w4.perm, bias=bias, config=cfg)
    assert y.dtype == dtype and y.shape == (m, n)
    # float32: exact up to summation order; half types: the output's rounding
    tol = 1e-4 if dtype == torch.float32 else 2 ** -7
    torch.testing.assert_close(y.float(), ref, rtol=tol, atol=tol * float(ref.abs().max()))


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
    small = default_config(4096, 4096, 128)            # 8B o: 256 tiles of 16 < 264 -> split
    assert small.block_k == 128 and small.block_n == 16 and small.split_k == 2
    big = default_config(28672, 4096, 128)             # 8B gate_up: 896 tiles of 32
    assert big.block_n == 32 and big.split_k == 1
    assert default_config(2048, 8192, 128).split_k == 4    # 1B down: 128 tiles of 16
    assert default_config(64, 128, 32).split_k == 1        # K too short to split
    assert TARGET_PROGRAMS > 0


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
    with pytest.raises(ValueError, match="scale: expected a floating \\[16, 4\\]"):
        gemv_int4(x, w4.qweight, w4.scale[:, :2], 32)
    with pytest.raises(ValueError, match="zero: expected uint8"):
        gemv_int4(x, *args, zero=w4.zero.int())
    with pytest.raises(ValueError, match="perm: expected contiguous int32 \\[128\\]"):
        gemv_int4(x, *args, perm=torch.arange(128))
    with pytest.raises(ValueError, match="bias: expected \\[16\\]"):
        gemv_int4(x, *args, bias=torch.zeros(8))
    with pytest.raises(ValueError, match="config: block_k=64 must be a multiple of 8"):
        gemv_int4(x, *args, config=Int4GemvConfig(16, 64, 4, 1))
    with pytest.raises(ValueError, match="config: split_k=3"):
        gemv_int4(x, *args, config=Int4GemvConfig(16, 32, 4, 1, 3))
    with pytest.raises(ValueError, match="config: block_m=8, expected 1, 2, 4 or 16"):
        gemv_int4(x, *args, config=Int4GemvConfig(16, 32, 4, 1, 1, 8))
    with pytest.raises(ValueError, match="out: expected \\[1, 16\\]"):
        gemv_int4(x, *args, out=torch.empty(2, 16))
