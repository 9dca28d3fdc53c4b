"""GPTQ int4 (AutoGPTQ / GPTQModel) -> graphrt's Int4Weight, one linear module at a time.

On disk, for a module with weight [N, K] (N out, K in), g the group size (K for -1), G = K / g:
    <m>.qweight  int32 [K/8, N]   packed along K: nibble i of qweight[r, n] is the code of row
                                  (input channel) 8r + i
    <m>.qzeros   int32 [G, N/8]   packed along N, the same bit order: column 8c + i
    <m>.scales   float16 [G, N]
    <m>.g_idx    int32 [K]        group of each input channel (act-order: not k // g); optional
    value(n, k) = (code - zero) * scale  with zero = stored + 1 ("gptq", v1) or stored ("gptq_v2")
A symmetric file's stored zeros are all 7 (v1) or all 8 (v2); the reader trusts them over the
label (a v2 file labelled "gptq" would otherwise decode to garbage) and reports the mismatch.
"""
from __future__ import annotations


from graphrt.checkpoint.files import CheckpointError, TensorFiles
from graphrt.checkpoint.int4_config import Int4Format
from graphrt.checkpoint.int4_packing import FLOATS, INT32, expect, unpack_nibbles
from graphrt.model.quant.int4 import Int4Weight, from_codes


def tensor_names(rd: TensorFiles, module: str) -> list[str]:
    names = [f"{module}.{s}" for s in ("qweight", "qzeros", "scales")]
    return names + ([f"{module}.g_idx"] if f"{module}.g_idx" in rd.names else [])


def check(rd: TensorFiles, module: str, fmt: Int4Format, n: int, k: int) -> None:
    g = k if fmt.group_size == -1 else fmt.group_size
    if k % g or k % 8 or n % 8:
        raise CheckpointError(f"{rd.path}: module {module!r} [{n}, {k}]: quantization_config.group_size "
                              f"{fmt.group_size} must divide K and N, K must be multiples of 8")
    expect(rd, f"{module}.qweight", (k // 8, n), INT32, "GPTQ")
    expect(rd, f"{module}.qzeros", (k // g, n // 8), INT32, "GPTQ")
    expect(rd, f"{module}.scales", (k // g, n), FLOATS, "GPTQ")
    if f"{module}.g_idx" in rd.names:
        expect(rd, f"{module}.g_idx", (k,), INT32 + ("I64",), "GPTQ")


def read(rd: TensorFiles, module: str, fmt: Int4Format, n: int, k: int) -> tuple[Int4Weight, bool]:
    """(host Int4Weight, v1): v1 whether the "+1" convention was applied."""
    g = k if fmt.group_size == -1 else fmt.group_size
    codes = unpack_nibbles(rd.tensor(f"{module}.qweight").t().contiguous())      # [N, K]
    stored = unpack_nibbles(rd.tensor(f"{module}.qzeros"))                        # [G, N]
    v1 = fmt.gptq_v1
    if fmt.symmetric:
        if bool((stored == 7).all()):
            v1 = True
        elif bool((stored == 8).all()):
            v1 = False
        else:
            raise CheckpointError(f"{rd.file(module + '.qzeros')}: tensor '{module}.qzeros': a symmetric "
                                  f"(quantization_config.sym) GPTQ file stores zeros all 7 (gptq) or all 8 "
                                  f"(gptq_v2); found {sorted(set(stored.flatten().tolist()))[:6]}")
    zero = stored + 1 if v1 else stored
    scale = rd.tensor(f"{module}.scales").t().contiguous()                        # [N, G]
    g_idx = rd.tensor(f"{module}.g_idx") if f"{module}.g_idx" in rd.names else None
    try:
        return from_codes(codes, scale, g, zero=zero.t(), g_idx=g_idx), v1
    except ValueError as e:
        raise CheckpointError(f"{rd.file(module + '.qweight')}: module {module!r}: {e}") from None


__all__ = ["check", "read", "tensor_names"]
