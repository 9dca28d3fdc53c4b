"""int4 weight-only (W4A16) weights: graphrt's one layout, quantization (RTN), dequantization, row fusion.

    w4 = quantize_int4(w, group_size=128)                # w [N, K] float -> Int4Weight (asymmetric)
    w4 = quantize_int4(w, group_size=-1, symmetric=True) # one scale per output row, zero 8
    w4.dequantize(torch.float32)                         # [N, K] float32, input channels in model order
    qkv = cat_rows([q4, k4, v4])                         # fused weight, each part keeps its scales

Every int4 checkpoint layout (GPTQ v1 / v2, AWQ GEMM, compressed-tensors pack-quantized) is
repacked into this one layout at load (graphrt/checkpoint/int4_*.py), and the kernels
(graphrt/kernels/gemv_int4.py) read only this one. The layout, for a weight [N, K] (N output
rows, K input columns, row-major like nn.Linear.weight), group size g (g divides K; a
per-channel weight has g = K), G = K / g groups per row:

    qweight  int32 [N, K/8]   packed along K: nibble i (bits 4i .. 4i+3, least significant
                              first) of qweight[n, c] is the unsigned code q in 0..15 of stored
                              column 8c + i (K must be a multiple of 8)
    scale    [N, G]           float16 / bfloat16 / float32 (as the checkpoint stores them)
    zero     uint8 [N, G]     integer zero point per (row, group), 0..16 (GPTQ v1's "+1"
             or None          convention can give 16); None: symmetric, zero = 8 for every group
    perm     int32 [K]        act-order (GPTQ desc_act): stored column j holds input channel
             or None          perm[j]; groups are contiguous in the stored order. None: identity

    value(n, stored column j) = (q(n, j) - zero[n, j // g]) * scale[n, j // g]   (float32)
    y = x @ W.T  with  W[:, perm[j]] = value(:, j)     (x in model channel order)

so qweight has exactly compressed-tensors' `weight_packed` bit layout (its q + 8 is the
symmetric code here). A GGUF Q4 block maps onto it when its 4-bit codes are unpacked to the
nibble order above and its per-block scale / minimum are expressed as scale and an integer zero
(Q4_0: zero 8; Q4_1's float minimum is not an integer zero and needs requantization).
Dequantization in float32 is the CPU path and the reference; on a GPU the GEMV multiplies the
exact small integers q - zero in the activation dtype and applies the group scale to each
group's float32 partial sum (graphrt.model.linear.int4_linear).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
GROUP_SIZES = (32, 64, 128, -1)          # -1: per channel (one group of K)
_TINY = 1e-10                            # scale floor: an all-zero group gets this scale


@dataclass(frozen=True)
class Int4Weight:
    """qweight int32 [N, K/8], scale [N, G] (float16 / bfloat16 / float32), zero uint8 [N, G] or
    None, perm int32 [K] or None, group_size g (G = K / g; per channel: g = K); all on one device
    (module docstring: the layout and its value)."""

    qweight: torch.Tensor
    scale: torch.Tensor
    group_size: int
    zero: torch.Tensor | None = None
    perm: torch.Tensor | None = None

    def __post_init__(self):
        q, s = self.qweight, self.scale
        if not isinstance(q, torch.Tensor) or q.dtype != torch.int32 or q.dim() != 2:
            raise ValueError(f"qweight: expected a 2-D int32 tensor [N, K/8], got "
                             f"{getattr(q, 'dtype', type(q).__name__)} {tuple(getattr(q, 'shape', ()))}")
        n, k = q.shape[0], q.shape[1] * 8
        g = self.group_size
        if isinstance(g, bool) or not isinstance(g, int) or g < 8 or k % g:
            raise ValueError(f"group_size: {g!r} must be a positive multiple of 8 dividing K={k}")
        if not isinstance(s, torch.Tensor) or s.dtype not in SCALE_DTYPES or s.device != q.device \
                or tuple(s.shape) != (n, k // g):
            raise ValueError(f"scale: expected {[str(d) for d in SCALE_DTYPES]} [{n}, {k // g}] on {q.device}, "
                             f"got {getattr(s, 'dtype', type(s).__name__)} {tuple(getattr(s, 'shape', ()))} "
                             f"on {getattr(s, 'device', None)}")
        z = self.zero
        if z is not None and (not isinstance(z, torch.Tensor) or z.dtype != torch.uint8
                              or tuple(z.shape) != (n, k // g) or z.device != q.device):
            raise ValueError(f"zero: expected uint8 [{n}, {k // g}] on {q.device} or None, got "
                             f"{getattr(z, 'dtype', type(z).__name__)} {tuple(getattr(z, 'shape', ()))}")
        p = self.perm
        if p is not None and (not isinstance(p, torch.Tensor) or p.dtype != torch.int32
                              or tuple(p.shape) != (k,) or p.device != q.device):
            raise ValueError(f"perm: expected int32 [{k}] on {q.device} or None, got "
                             f"{getattr(p, 'dtype', type(p).__name__)} {tuple(getattr(p, 'shape', ()))}")

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.qweight.shape[0], self.qweight.shape[1] * 8))

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    @property
    def groups(self) -> int:
        return self.shape[1] // self.group_size

    @property
    def nbytes(self) -> int:
        """Bytes a GEMV streams: packed codes + scales + zeros (+ the act-order permutation)."""
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scale, self.zero, self.perm)
                   if t is not None)

    def is_contiguous(self) -> bool:
        return all(t.is_contiguous() for t in (self.qweight, self.scale, self.zero, self.perm) if t is not None)

    def codes(self) -> torch.Tensor:
        """[N, K] uint8: the unsigned 4-bit codes in stored column order."""
        q = self.qweight
        shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=q.device)
        return ((q[:, :, None] >> shifts) & 0xF).reshape(q.shape[0], -1).to(torch.uint8)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[N, K] in `dtype` (computed in float32), columns in model (input channel) order."""
        g = self.group_size
        zero = 8.0 if self.zero is None else self.zero.float().repeat_interleave(g, 1)
        w = (self.codes().float() - zero) * self.scale.float().repeat_interleave(g, 1)
        if self.perm is not None:
            out = torch.empty_like(w)
            out[:, self.perm.long()] = w
            w = out
        return w.to(dtype)

    def to(self, device) -> "Int4Weight":
        def mv(t):
            return None if t is None else t.to(device)
        return Int4Weight(self.qweight.to(device), self.scale.to(device), self.group_size,
                          mv(self.zero), mv(self.perm))


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """[N, K] integer codes in 0..15 (K a multiple of 8) -> int32 [N, K/8] in the layout above."""
    if codes.dim() != 2 or codes.shape[1] % 8:
        raise ValueError(f"codes: expected [N, K] with K a multiple of 8, got {tuple(codes.shape)}")
    c = codes.to(torch.int64).reshape(codes.shape[0], -1, 8)
    shifts = torch.arange(0, 32, 4, dtype=torch.int64, device=codes.device)
    word = (c << shifts).sum(-1)                                   # 0 .. 2^32 - 1
    return torch.where(word >= 2 ** 31, word - 2 ** 32, word).to(torch.int32)


def from_codes(codes: torch.Tensor, scale: torch.Tensor, group_size: int, *,
               zero: torch.Tensor | None = None, g_idx: torch.Tensor | None = None) -> Int4Weight:
    """The layout from unpacked parts (host or device; result on codes' device):
    codes [N, K] integers 0..15 in input-channel order, scale [N, G] float (kept in its dtype if
    float16 / bfloat16 / float32), zero [N, G] integers 0..16 (the true zero) or None (8),
    g_idx [K] integers: the group of input channel k (None: k // group_size). Non-trivial g_idx
    (act-order) becomes `perm` = the stable argsort of g_idx, the codes' columns permuted to it;
    each group must then be group_size consecutive columns (ValueError naming g_idx). Zeros
    that are all 8 are dropped (the symmetric kernel path)."""
    n, k = codes.shape
    if k % group_size:
        raise ValueError(f"group_size: {group_size} does not divide K={k}")
    perm = None
    if g_idx is not None:
        g_idx = g_idx.to(torch.int64).reshape(-1)
        want = torch.arange(k, device=g_idx.device) // group_size
        if g_idx.shape != (k,):
            raise ValueError(f"g_idx: {tuple(g_idx.shape)} entries, expected [{k}]")
        if not torch.equal(g_idx, want):
            order = torch.argsort(g_idx, stable=True)
            if not torch.equal(g_idx[order], want):
                raise ValueError(f"g_idx: groups must each hold group_size={group_size} input channels "
                                 f"(counts {torch.bincount(g_idx.clamp(min=0)).tolist()[:8]}...)")
            codes, perm = codes[:, order.to(codes.device)], order.to(torch.int32).to(codes.device)
    if zero is not None:
        zero = None if bool((zero == 8).all()) else zero.to(torch.uint8).contiguous()
    if scale.dtype not in SCALE_DTYPES:
        scale = scale.float()
    return Int4Weight(pack_codes(codes).contiguous(), scale.contiguous(), group_size, zero, perm)


def quantize_int4(w: torch.Tensor, group_size: int = 128, *, symmetric: bool = False,
                  scale_dtype: torch.dtype = torch.float16) -> Int4Weight:
    """Round-to-nearest: w [N, K] floating (any device; K a multiple of 8 and of group_size,
    -1 = per channel) -> Int4Weight on w's device. Asymmetric (default): per group
    scale = (max - min) / 15, zero = round(-min / scale) in 0..15, q = clamp(round(w / scale)
    + zero, 0, 15). Symmetric: scale = amax / 7, zero 8, q = clamp(round(w / scale) + 8, 0, 15).
    Scales are rounded to scale_dtype before the codes are computed (the codes fit them)."""
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"w: expected a 2-D floating tensor, got {getattr(w, 'shape', type(w).__name__)}")
    n, k = w.shape
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size: {group_size!r}, expected one of {GROUP_SIZES}")
    g = k if group_size == -1 else group_size
    if k % 8 or k % g:
        raise ValueError(f"w: K={k} must be a multiple of 8 and of group_size={g}")
    if scale_dtype not in SCALE_DTYPES:
        raise ValueError(f"scale_dtype: {scale_dtype}, expected one of {SCALE_DTYPES}")
    wg = w.float().reshape(n, k // g, g)
    if symmetric:
        scale = (wg.abs().amax(-1) / 7.0).clamp(min=_TINY).to(scale_dtype)
        zero = torch.full_like(scale, 8.0, dtype=torch.float32)
    else:
        lo, hi = wg.amin(-1).clamp(max=0.0), wg.amax(-1).clamp(min=0.0)
        scale = ((hi - lo) / 15.0).clamp(min=_TINY).to(scale_dtype)
        zero = torch.round(-lo / scale.float()).clamp(0, 15)
    q = torch.round(wg / scale.float()[..., None]) + zero[..., None]
    codes = q.clamp(0, 15).reshape(n, k)
    return Int4Weight(pack_codes(codes).contiguous(), scale.contiguous(), g,
                      None if symmetric else zero.to(torch.uint8).contiguous())


def cat_rows(parts: list[Int4Weight]) -> Int4Weight:
    """Row-concatenate int4 weights (qkv, gate_up): codes, scales and zeros concatenated, so
    every part keeps its own. Parts need one group size, one scale dtype and one act-order
    permutation (ValueError naming the field); a symmetric part next to an asymmetric one gets
    explicit zeros of 8."""
    for field, values in (("group_size", {p.group_size for p in parts}),
                          ("scale", {p.scale.dtype for p in parts})):
        if len(values) != 1:
            raise ValueError(f"parts: mixed {field} {sorted(map(str, values))}; fuse one kind")
    perms = [p.perm for p in parts]
    if any(p is None for p in perms) != all(p is None for p in perms) or \
            any(p is not None and not torch.equal(p, perms[0]) for p in perms):
        raise ValueError("perm: parts with different act-order permutations (g_idx) cannot share one "
                         "input; fuse parts quantized with the same g_idx")
    zero = None
    if any(p.zero is not None for p in parts):
        zero = torch.cat([p.zero if p.zero is not None else torch.full_like(p.scale, 8, dtype=torch.uint8)
                          for p in parts]).contiguous()
    return Int4Weight(torch.cat([p.qweight for p in parts]).contiguous(),
                      torch.cat([p.scale for p in parts]).contiguous(), parts[0].group_size, zero, perms[0])


__all__ = ["GROUP_SIZES", "Int4Weight", "SCALE_DTYPES", "cat_rows", "from_codes", "pack_codes", "quantize_int4"]
