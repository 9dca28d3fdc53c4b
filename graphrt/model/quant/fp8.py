"""FP8 (e4m3) weights: storage, scales, quantization, dequantization, row fusion.

    w8 = quantize_fp8(w, "channel")                 # w [N, K] float -> Fp8Weight (scale [N])
    w8 = quantize_fp8(w, "block", block=(128, 128)) # scale [ceil(N/128), ceil(K/128)]
    w8.dequantize(torch.float32)                    # [N, K] float32 = data * scale (broadcast)
    qkv = cat_rows([q8, k8, v8])                    # fused weight, each part keeps its scale

An `Fp8Weight` is what `graphrt.model.weights.LayerWeights` holds for qkv / o / gate_up / down
(and lm_head unless the checkpoint ignores it) when the model runs FP8 weights. The value of
element (n, k) is `float(data[n, k]) * scale[n]` (per-channel) or
`float(data[n, k]) * scale[n // bn, k // bk]` (block (bn, bk)). Per-tensor scales are stored
per-channel (one value repeated over the rows): that is exact, and it is what lets fused
weights keep each part's scale; a weight quantized per tensor as a whole also keeps the value
as `tensor_scale` (the fast W8A8 path: no column scales to apply). Dequantization in float32 is the CPU path and the reference;
on a GPU the GEMV / GEMM kernels dequantize in registers (`graphrt.model.linear.linear`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0                     # largest finite e4m3fn value
STRATEGIES = ("tensor", "channel", "block")
_TINY = 1e-12                       # scale floor: an all-zero row/block gets scale 1e-12, data 0


@dataclass(frozen=True)
class Fp8Weight:
    """data [N, K] float8_e4m3fn (row-major); scale float32: [N] per-channel, or
    [ceil(N/bn), ceil(K/bk)] with block=(bn, bk); both on one device. tensor_scale: a 0-dim
    float32 tensor on that device when the whole weight has one scale (then scale is that value
    repeated): the W8A8 GEMM applies it itself (cuBLASLt's per-tensor scale) and its consumer
    needs no column scales."""

    data: torch.Tensor
    scale: torch.Tensor
    block: tuple[int, int] | None = None
    tensor_scale: torch.Tensor | None = None

    def __post_init__(self):
        d, s = self.data, self.scale
        if not isinstance(d, torch.Tensor) or d.dtype != FP8 or d.dim() != 2:
            raise ValueError(f"data: expected a 2-D {FP8} tensor, got "
                             f"{getattr(d, 'dtype', type(d).__name__)} {tuple(getattr(d, 'shape', ()))}")
        if not isinstance(s, torch.Tensor) or s.dtype != torch.float32 or s.device != d.device:
            raise ValueError(f"scale: expected float32 on {d.device}, got "
                             f"{getattr(s, 'dtype', type(s).__name__)} on {getattr(s, 'device', None)}")
        n, k = d.shape
        if self.block is None:
            want = (n,)
        else:
            bn, bk = self.block
            if bn < 1 or bk < 1:
                raise ValueError(f"block: expected positive sizes, got {self.block}")
            want = (-(-n // bn), -(-k // bk))
        if tuple(s.shape) != want:
            raise ValueError(f"scale: shape {tuple(s.shape)}, expected {want} for data {tuple(d.shape)} "
                             f"and block={self.block}")
        t = self.tensor_scale
        if t is not None and (not isinstance(t, torch.Tensor) or t.dim() != 0 or t.dtype != torch.float32
                              or t.device != d.device or self.block is not None):
            raise ValueError(f"tensor_scale: expected a 0-dim float32 tensor on {d.device} (no block "
                             f"scales), got {getattr(t, 'shape', type(t).__name__)}")

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def nbytes(self) -> int:
        """Bytes a GEMV streams: the FP8 data plus the scales."""
        return self.data.numel() + self.scale.numel() * 4

    def is_contiguous(self) -> bool:
        return self.data.is_contiguous() and self.scale.is_contiguous()

    def row_scale(self) -> torch.Tensor:
        """[N, ceil(K/bk)] (block) or [N, 1] (per-channel) float32: each row's scale(s)."""
        if self.block is None:
            return self.scale[:, None]
        return self.scale.repeat_interleave(self.block[0], 0)[: self.shape[0]]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[N, K] in `dtype` (computed in float32): the values the kernels multiply by."""
        s = self.row_scale()
        if self.block is not None:
            s = s.repeat_interleave(self.block[1], 1)[:, : self.shape[1]]
        return (self.data.float() * s).to(dtype)

    def to(self, device) -> "Fp8Weight":
        t = None if self.tensor_scale is None else self.tensor_scale.to(device)
        return Fp8Weight(self.data.to(device), self.scale.to(device), self.block, t)


def quantize_fp8(w: torch.Tensor, strategy: str = "channel", *,
                 block: tuple[int, int] = (128, 128)) -> Fp8Weight:
    """w [N, K] floating (any device) -> Fp8Weight on w's device with amax / 448 scales
    (per tensor, per output row, or per (bn, bk) block). Per-tensor is stored per-channel."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy: {strategy!r}, expected one of {STRATEGIES}")
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"w: expected a 2-D floating tensor, got {getattr(w, 'shape', type(w).__name__)}")
    wf = w.float()
    n, k = wf.shape
    if strategy == "block":
        bn, bk = block
        pn, pk = -(-n // bn) * bn, -(-k // bk) * bk
        padded = torch.zeros((pn, pk), dtype=torch.float32, device=w.device)
        padded[:n, :k] = wf
        amax = padded.view(pn // bn, bn, pk // bk, bk).abs().amax(dim=(1, 3))
        scale = (amax / FP8_MAX).clamp(min=_TINY)
        s_full = scale.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
        data = (wf / s_full).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        return Fp8Weight(data.contiguous(), scale.contiguous(), (bn, bk))
    tensor = None
    if strategy == "tensor":
        tensor = (wf.abs().amax() / FP8_MAX).clamp(min=_TINY)
        scale = tensor.expand(n).clone()
    else:
        scale = (wf.abs().amax(dim=1) / FP8_MAX).clamp(min=_TINY)
    data = (wf / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return Fp8Weight(data.contiguous(), scale.contiguous(), None, tensor)


def cat_rows(parts: list[Fp8Weight]) -> Fp8Weight:
    """Row-concatenate FP8 weights (qkv, gate_up): data and scales concatenated, so every part
    keeps its own scale (the result has no tensor_scale: parts' scales differ in general). Block-scaled parts need one block shape and, except the last, a row
    count that is a multiple of the block rows (else ValueError naming the part)."""
    blocks = {p.block for p in parts}
    if len(blocks) != 1:
        raise ValueError(f"parts: mixed scale layouts {sorted(map(str, blocks))}; fuse one kind")
    block = blocks.pop()
    if block is not None:
        for i, p in enumerate(parts[:-1]):
            if p.shape[0] % block[0]:
                raise ValueError(f"parts[{i}]: {p.shape[0]} rows is not a multiple of the block rows "
                                 f"{block[0]}; its scales cannot be fused")
    return Fp8Weight(torch.cat([p.data for p in parts]).contiguous(),
                     torch.cat([p.scale for p in parts]).contiguous(), block)


__all__ = ["FP8", "FP8_MAX", "Fp8Weight", "STRATEGIES", "cat_rows", "quantize_fp8"]
