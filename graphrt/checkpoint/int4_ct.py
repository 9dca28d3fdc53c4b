"""compressed-tensors `pack-quantized` int4 (llm-compressor W4A16) -> graphrt's Int4Weight.

On disk, for a module with weight [N, K], g the group size (K for strategy "channel"), G = K / g:
    <m>.weight_packed      int32 [N, K/8]    packed along K: nibble i of word c = code of column
                                             8c + i; code = q + 8 (q the signed value, -8..7)
    <m>.weight_scale       float [N, G]
    <m>.weight_zero_point  int32 [N/8, G]    asymmetric only; packed along N (dim 0): nibble i of
                                             [r, gi] = zero code of row 8r + i (zero point + 8)
    <m>.weight_shape       int [2]           [N, K]
    <m>.weight_g_idx       int32 [K]         actorder "group" only
    value(n, k) = (q - zp) * scale = (code - zero code) * scale; symmetric: zero code 8
The codes are graphrt's layout already; the zero points are unpacked and transposed.
"""
from __future__ import annotations

from graphrt.checkpoint.files import CheckpointError, TensorFiles
from graphrt.checkpoint.int4_config import Int4Format
from graphrt.checkpoint.int4_packing import FLOATS, INT32, expect, unpack_nibbles
from graphrt.model.quant.int4 import Int4Weight, from_codes


def tensor_names(rd: TensorFiles, module: str) -> list[str]:
    names = [f"{module}.{s}" for s in ("weight_packed", "weight_scale", "weight_shape")]
    names += [f"{module}.{s}" for s in ("weight_zero_point", "weight_g_idx") if f"{module}.{s}" in rd.names]
    return names


def check(rd: TensorFiles, module: str, fmt: Int4Format, n: int, k: int) -> None:
    g = k if fmt.group_size == -1 else fmt.group_size
    if k % g or k % 8 or n % 8:
        raise CheckpointError(f"{rd.path}: module {module!r} [{n}, {k}]: the group size {fmt.group_size} "
                              f"must divide K, and N and K must be multiples of 8")
    expect(rd, f"{module}.weight_packed", (n, k // 8), INT32, "compressed-tensors pack-quantized")
    expect(rd, f"{module}.weight_scale", (n, k // g), FLOATS, "compressed-tensors pack-quantized")
    shape = rd.tensor(f"{module}.weight_shape").tolist()
    if shape != [n, k]:
        raise CheckpointError(f"{rd.file(module + '.weight_shape')}: tensor '{module}.weight_shape' is "
                              f"{shape}; config.json implies {[n, k]}")
    if not fmt.symmetric:
        expect(rd, f"{module}.weight_zero_point", (n // 8, k // g), INT32, "asymmetric pack-quantized")
    if f"{module}.weight_g_idx" in rd.names:
        expect(rd, f"{module}.weight_g_idx", (k,), INT32 + ("I64",), "compressed-tensors actorder")


def read(rd: TensorFiles, module: str, fmt: Int4Format, n: int, k: int) -> Int4Weight:
    g = k if fmt.group_size == -1 else fmt.group_size
    codes = unpack_nibbles(rd.tensor(f"{module}.weight_packed"))                   # [N, K]
    zero = None
    if not fmt.symmetric:
        zero = unpack_nibbles(rd.tensor(f"{module}.weight_zero_point").t().contiguous())   # [G, N]
        zero = zero.t()
    g_idx = rd.tensor(f"{module}.weight_g_idx") if f"{module}.weight_g_idx" in rd.names else None
    try:
        return from_codes(codes, rd.tensor(f"{module}.weight_scale"), g, zero=zero, g_idx=g_idx)
    except ValueError as e:
        raise CheckpointError(f"{rd.file(module + '.weight_packed')}: module {module!r}: {e}") from None


__all__ = ["check", "read", "tensor_names"]
