"""GGML block-quantized weights (llama.cpp's GGUF tensor types) dequantized with torch ops.

    raw = torch.from_numpy(tensor.data).view(torch.uint8)     # [..., row bytes], whole blocks per row
    w = dequantize(raw, "Q4_K")                               # float32 [..., row weights], raw's device
    BLOCKS["Q4_K"]                                            # (256 weights, 144 bytes) per block

Vectorised over blocks (the raw bytes viewed as uint8 [n_blocks, block bytes], fields sliced, bits
unpacked with shifts and masks), no Python loop per block: the same code runs on CPU tensors
(torch's CPU threads, CPU_STEP weights at a time so the temporaries stay in the caches) and on
CUDA tensors (GPU_STEP weights at a time: temporaries of a few bytes a weight). The integer codes
are widened into the float32 result, then scaled there in place. Every result equals
`gguf.quants.dequantize` bit for bit: the same float operations in the same order (fp16 -> fp32
scales, exact integer -> fp32 codes, the products as written below; nothing fused). No Triton, no
NumPy.

A row of a GGUF tensor (ne0 weights along the input dimension) is a run of whole blocks, so rows
[a, b) of a weight are rows [a, b) of its raw bytes. Fields are little-endian; `d`, `m`, `dmin`
are fp16. Blocks of 32 weights (q: the code of weight i of the block):

    Q4_0  18 B  d, qs[16]             q = qs[i] & 15 (i < 16), qs[i - 16] >> 4; w = d * (q - 8)
    Q4_1  20 B  d, m, qs[16]          q as Q4_0; w = d * q + m
    Q5_0  22 B  d, qh[4], qs[16]      q = Q4_0's | (bit i of qh as a uint32) << 4; w = d * (q - 16)
    Q5_1  24 B  d, m, qh[4], qs[16]   q as Q5_0; w = d * q + m
    Q8_0  34 B  d, qs[32] int8        w = d * qs[i]

K-quants: super-blocks of 256 weights, sub-blocks of 16 or 32 with integer scales:

    Q2_K   84 B  scales[16], qs[64], d, dmin
                 sub-block j (16 weights): sc = scales[j] & 15, mn = scales[j] >> 4; q: 2 bits, byte
                 i of each 32-byte half of qs holds weights i, i+32, i+64, i+96 of the half's 128
                 at shifts 0, 2, 4, 6; w = (d * sc) * q - (dmin * mn)
    Q3_K  110 B  hmask[32], qs[64], scales[12], d
                 sub-block j (16 weights): sc = 6 bits - 32, low 4: scales[j] & 15 (j < 8) or
                 scales[j - 8] >> 4, high 2: scales[8 + j % 4] >> 2 (j // 4); q: 2 bits as Q2_K,
                 minus 4 where bit k of hmask[i] is 0 (weight 32 k + i); w = (d * sc) * q
    Q4_K  144 B  d, dmin, scales[12], qs[128]
                 sub-block j (32 weights): 6-bit scale sc and min mn: j < 4: scales[j] & 63,
                 scales[j + 4] & 63; j >= 4: scales[j + 4] & 15 | (scales[j - 4] >> 6) << 4,
                 scales[j + 4] >> 4 | (scales[j] >> 6) << 4; q: each 32 bytes of qs give 32 low
                 nibbles, then 32 high ones; w = (d * sc) * q - (dmin * mn)
    Q5_K  176 B  d, dmin, scales[12], qh[32], qs[128]
                 as Q4_K, q |= (bit k of qh[i]) << 4 for weight 32 k + i
    Q6_K  210 B  ql[128], qh[64], scales[16] int8, d
                 sub-block j (16 weights): sc = scales[j]; per 128 weights (64 bytes of ql, 32 of
                 qh): 32-weight runs of ql[0:32] low, ql[32:64] low, ql[0:32] high, ql[32:64] high
                 nibbles, | qh[0:32] at shifts 0, 2, 4, 6 << 4; q - 32; w = (d * sc) * q

F32, F16 and BF16 (one weight per "block") are here too: a copy, exact widenings.
"""
from __future__ import annotations

import torch

QK_K = 256
# GGML type name -> (weights, bytes) per block
BLOCKS = {"F32": (1, 4), "F16": (1, 2), "BF16": (1, 2),
          "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34),
          "Q2_K": (QK_K, 84), "Q3_K": (QK_K, 110), "Q4_K": (QK_K, 144), "Q5_K": (QK_K, 176),
          "Q6_K": (QK_K, 210)}


def _f16(b: torch.Tensor, at: int) -> torch.Tensor:
    """The fp16 field at byte `at` of every block, as float32 [n, 1]."""
    return b[:, at:at + 2].view(torch.float16).float()


def _bits(x: torch.Tensor, width: int) -> torch.Tensor:
    """x uint8 [..., k] -> uint8 [..., 8 // width, k]: the `width`-bit fields at shifts 0, width, ...
    (the bytes repeated into a fresh tensor, then shifted in place by a [8 // width, k] table:
    no zero stride in the inner loop, the fast path of torch's CPU kernels)."""
    m, k = 8 // width, x.shape[-1]
    shifts = torch.arange(0, 8, width, dtype=torch.uint8, device=x.device).view(m, 1).expand(m, k).contiguous()
    q = torch.empty(*x.shape[:-1], m, k, dtype=torch.uint8, device=x.device)
    q.copy_(x.unsqueeze(-2))
    return q.bitwise_right_shift_(shifts).bitwise_and_((1 << width) - 1)


def _nibbles(b: torch.Tensor, at: int, run: int, n_bytes: int) -> torch.Tensor:
    """The 4-bit codes of bytes [at, at + n_bytes) of every block, each `run` bytes giving `run`
    low nibbles then `run` high ones: uint8 [n, 2 * n_bytes]. (Shifts and masks on whole blocks,
    then one gather of the field: long contiguous loops, the fast path of torch's CPU kernels.)"""
    n = b.shape[0]
    lo = (b & 15)[:, at:at + n_bytes].reshape(n, -1, 1, run)
    hi = (b >> 4)[:, at:at + n_bytes].reshape(n, -1, 1, run)
    return torch.cat([lo, hi], dim=2).reshape(n, 2 * n_bytes)


# Each type below writes its integer codes into `out` (an exact widening to float32, no float
# temporary), then scales it in place: out * d equals the reference's d * q bit for bit.

def _q4_0(b, out):
    out.copy_(_nibbles(b, 2, 16, 16).sub_(8).view(torch.int8)).mul_(_f16(b, 0))     # q - 8 wrapped into int8


def _q4_1(b, out):
    out.copy_(_nibbles(b, 4, 16, 16)).mul_(_f16(b, 0)).add_(_f16(b, 2))


def _q5(b, at):
    """Q5_0 / Q5_1 codes (0..31) of blocks whose qh starts at byte `at`: uint8 [n, 32]."""
    qh = b[:, at:at + 4].clone(memory_format=torch.contiguous_format).view(torch.int32)   # [n, 1]
    shifts = torch.arange(32, dtype=torch.int32, device=b.device)
    high = (qh >> shifts).to(torch.uint8).bitwise_and_(1)                # bit j, [n, 32]
    return _nibbles(b, at + 4, 16, 16) | (high << 4)


def _q5_0(b, out):
    out.copy_(_q5(b, 2).sub_(16).view(torch.int8)).mul_(_f16(b, 0))


def _q5_1(b, out):
    out.copy_(_q5(b, 4)).mul_(_f16(b, 0)).add_(_f16(b, 2))


def _q8_0(b, out):
    out.copy_(b[:, 2:34].view(torch.int8)).mul_(_f16(b, 0))


def _q2_k(b, out):
    n, scales = b.shape[0], b[:, :16]
    dl = (_f16(b, 80) * (scales & 15).float()).unsqueeze(-1)             # [n, 16, 1]
    ml = (_f16(b, 82) * (scales >> 4).float()).unsqueeze(-1)
    q = _bits(b[:, 16:80].reshape(n, 2, 32), 2).reshape(n, 16, 16)
    out.view(n, 16, 16).copy_(q).mul_(dl).sub_(ml)


def _q3_k(b, out):
    n, s = b.shape[0], b[:, 96:108]
    low = _bits(s[:, :8], 4).reshape(n, 16)
    high = _bits(s[:, 8:12], 2).reshape(n, 16)
    sc = (low | (high << 4)).sub_(32).view(torch.int8).float()
    dl = (_f16(b, 108) * sc).unsqueeze(-1)                                # [n, 16, 1]
    ql = _bits(b[:, 32:96].reshape(n, 2, 32), 2).reshape(n, 16, 16)
    qh = _bits(b[:, :32].reshape(n, 1, 32), 1).reshape(n, 16, 16)
    q = ql.view(torch.int8) - ((qh ^ 1) << 2).view(torch.int8)          # q - 4 where the hmask bit is 0
    out.view(n, 16, 16).copy_(q).mul_(dl)


def _scale_min_k4(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K's 12 scale bytes [n, 12] -> (scales, mins) float32 [n, 8, 1] (6-bit integers)."""
    s = s.reshape(-1, 3, 4)
    lo, mn, hi = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([lo & 63, (hi & 15) | ((lo >> 2) & 48)], dim=-1)
    m = torch.cat([mn & 63, (hi >> 4) | ((mn >> 2) & 48)], dim=-1)
    return sc.float().unsqueeze(-1), m.float().unsqueeze(-1)


def _k4(b, q, out):
    """Q4_K / Q5_K: w = (d * sc) * q - (dmin * mn) for codes q uint8 [n, 8, 32]."""
    n = b.shape[0]
    sc, m = _scale_min_k4(b[:, 4:16])
    d, dm = _f16(b, 0).unsqueeze(-1) * sc, _f16(b, 2).unsqueeze(-1) * m   # [n, 8, 1]
    out.view(n, 8, 32).copy_(q).mul_(d).sub_(dm)


def _q4_k(b, out):
    _k4(b, _nibbles(b, 16, 32, 128).view(-1, 8, 32), out)


def _q5_k(b, out):
    qh = _bits(b[:, 16:48], 1)                                            # [n, 8, 32]
    _k4(b, _nibbles(b, 48, 32, 128).view(-1, 8, 32) | (qh << 4), out)


def _q6_k(b, out):
    n = b.shape[0]
    d = (_f16(b, 208) * b[:, 192:208].view(torch.int8).float()).unsqueeze(-1)   # [n, 16, 1]
    ql = _nibbles(b, 0, 64, 128).view(n, 8, 32)
    qh = _bits(b[:, 128:192].reshape(n, 2, 32), 2).reshape(n, 8, 32)
    q = (ql | (qh << 4)).sub_(32).view(torch.int8).view(n, 16, 16)
    out.view(n, 16, 16).copy_(q).mul_(d)


def _f32(b, out):
    out.copy_(b.view(torch.float32))


def _f16_weights(b, out):
    out.copy_(b.view(torch.float16))


def _bf16(b, out):
    out.copy_(b.view(torch.bfloat16))


_DEQUANTIZE = {"F32": _f32, "F16": _f16_weights, "BF16": _bf16,
               "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0,
               "Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}
CPU_STEP = 1 << 20             # weights per step on the CPU (4 MB of float32 out: the temporaries stay cached)
GPU_STEP = 1 << 26             # weights per step on a GPU (temporaries bounded, few launches)


def dequantize(raw: torch.Tensor, kind: str, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """raw: uint8 [..., k * block bytes] (any device) of GGML type `kind` (a key of BLOCKS) ->
    float32 [..., k * block weights] on raw's device, equal bit for bit to gguf.quants.dequantize;
    written into `out` when given (contiguous float32 of that shape on raw's device) and returned.
    ValueError for another dtype, a type without a dequantizer here, a partial block or a bad `out`."""
    if kind not in _DEQUANTIZE:
        raise ValueError(f"kind: {kind!r} has no torch dequantizer; known {sorted(_DEQUANTIZE)}")
    if raw.dtype != torch.uint8:
        raise ValueError(f"raw: expected uint8 bytes, got {raw.dtype}")
    weights, size = BLOCKS[kind]
    if raw.dim() == 0 or raw.shape[-1] % size:
        raise ValueError(f"raw: the last dimension ({raw.shape[-1] if raw.dim() else 'a scalar'}) is not "
                         f"whole {kind} blocks of {size} bytes")
    shape = (*raw.shape[:-1], raw.shape[-1] // size * weights)
    if out is None:
        out = torch.empty(shape, dtype=torch.float32, device=raw.device)
    elif not fits(out, shape, raw.device):
        raise ValueError(f"out: expected a contiguous float32 tensor of shape {list(shape)} on {raw.device}, got "
                         f"{out.dtype} {list(out.shape)} on {out.device}{'' if out.is_contiguous() else ', strided'}")
    blocks = raw.contiguous().view(-1, size)
    if blocks.storage_offset() % 4:                                       # fields viewed as fp16 / fp32
        blocks = blocks.clone()
    flat = out.view(-1, weights)
    step = max(1, (CPU_STEP if raw.device.type == "cpu" else GPU_STEP) // weights)       # blocks
    for i in range(0, blocks.shape[0], step):
        _DEQUANTIZE[kind](blocks[i:i + step], flat[i:i + step])
    return out


def fits(out: torch.Tensor, shape: tuple[int, ...], device: torch.device) -> bool:
    """`out` can take dequantize's result of `shape` on `device` directly."""
    return out.dtype == torch.float32 and out.device == device and tuple(out.shape) == tuple(shape) \
        and out.is_contiguous()


__all__ = ["BLOCKS", "QK_K", "dequantize", "fits"]
