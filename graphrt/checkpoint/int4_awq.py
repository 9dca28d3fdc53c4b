"""AWQ int4, GEMM packing (AutoAWQ `version: "gemm"`) -> graphrt's Int4Weight, per module.

On disk, for a module with weight [N, K], g the group size, G = K / g:
    <m>.qweight  int32 [K, N/8]   packed along N (output dim): nibble i (bits 4i) of
                                  qweight[k, c] holds column 8c + AWQ_ORDER[i]
    <m>.qzeros   int32 [G, N/8]   the same interleave (AutoAWQ writes it also with zero_point
                                  false: all 8)
    <m>.scales   float16 [G, N]
    value(n, k) = (code - zero) * scale      (no "+1")
"""
from __future__ import annotations

from graphrt.checkpoint.files import CheckpointError, TensorFiles
from graphrt.checkpoint.int4_config import Int4Format
from graphrt.checkpoint.int4_packing import FLOATS, INT32, expect, unpack_nibbles
from graphrt.model.quant.int4 import Int4Weight, from_codes

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)        # nibble i -> column offset within its word


def tensor_names(rd: TensorFiles, module: str) -> list[str]:
    names = [f"{module}.{s}" for s in ("qweight", "scales")]
    return names + ([f"{module}.qzeros"] if f"{module}.qzeros" in rd.names else [])


def check(rd: TensorFiles, module: str, fmt: Int4Format, n: int, k: int) -> None:
    g = k if fmt.group_size == -1 else fmt.group_size
    if k % g or k % 8 or n % 8:
        raise CheckpointError(f"{rd.path}: module {module!r} [{n}, {k}]: quantization_config.group_size "
                              f"{fmt.group_size} must divide K, and N and K must be multiples of 8")
    expect(rd, f"{module}.qweight", (k, n // 8), INT32, "AWQ GEMM")
    expect(rd, f"{module}.scales", (k // g, n), FLOATS, "AWQ GEMM")
    if f"{module}.qzeros" in rd.names:
        expect(rd, f"{module}.qzeros", (k // g, n // 8), INT32, "AWQ GEMM")
    elif not fmt.symmetric:
        raise CheckpointError(f"{rd.path}: tensor '{module}.qzeros' missing; quantization_config.zero_point "
                              f"is true")


def read(rd: TensorFiles, module: str, fmt: Int4Format, n: int, k: int) -> Int4Weight:
    g = k if fmt.group_size == -1 else fmt.group_size
    codes = unpack_nibbles(rd.tensor(f"{module}.qweight"), AWQ_ORDER).t().contiguous()   # [N, K]
    zero = None
    if f"{module}.qzeros" in rd.names:
        zero = unpack_nibbles(rd.tensor(f"{module}.qzeros"), AWQ_ORDER).t()              # [N, G]
    scale = rd.tensor(f"{module}.scales").t().contiguous()
    return from_codes(codes, scale, g, zero=zero)


__all__ = ["AWQ_ORDER", "check", "read", "tensor_names"]
