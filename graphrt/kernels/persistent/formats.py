"""The weight formats the persistent step's GEMV tile takes, read from a model's weights (host, no Triton).

    f = weight_format(weights)     # a WeightFormat, or a str: why the step cannot run them
    f.fmt, f.head_fmt              # FMT_MODEL / FMT_FP8 / FMT_INT4 (gemv_tile.py's FMT)

The layers' linear weights (qkv, o, gate_up, down) share one format; the LM head has the
model dtype or the layers' format. The weights are read by attribute (the kernels layer
imports nothing from graphrt.model):
- FMT_MODEL: a contiguous [N, K] tensor in the model dtype.
- FMT_FP8: graphrt.model.quant.fp8.Fp8Weight without block scales: `data` [N, K]
  float8_e4m3fn, `scale` [N] float32 (per-channel; a per-tensor scale is stored per channel).
  Block-scaled FP8 weights are refused.
- FMT_INT4: graphrt.model.quant.int4.Int4Weight: `qweight` int32 [N, K/8], `scale` [N, G]
  (one float dtype for every weight), `zero` uint8 [N, G] or None (for every weight alike),
  `group_size` (one for every weight, a multiple of 16; or every weight per channel, group_size =
  its K: PER_CHANNEL). Act-order weights (`perm`) are refused:
  the GEMV would gather its activation columns through the permutation in every chunk.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

FMT_MODEL, FMT_FP8, FMT_INT4 = 0, 1, 2
FORMAT_NAMES = {FMT_MODEL: "model dtype", FMT_FP8: "FP8", FMT_INT4: "int4"}
NO_CAP = 1 << 16            # GK of formats without groups: no cap on a chunk's width
PER_CHANNEL = 1 << 30       # int4 group size of per-channel weights (one group of K, any K below it)


@dataclass(frozen=True)
class WeightFormat:
    """fmt: the layers' linears' format; head_fmt: the LM head's (FMT_MODEL or fmt); group: int4's
    group size (PER_CHANNEL: one group of every weight's K; 1 otherwise); has_zero: int4 with zero points (else zero 8); scale_dtype: the
    scales' dtype (None for model-dtype weights)."""
    fmt: int
    head_fmt: int
    group: int = 1
    has_zero: bool = False
    scale_dtype: torch.dtype | None = None

    @staticmethod
    def _bytes(fmt: int, model_bytes: int) -> float:
        return {FMT_MODEL: model_bytes, FMT_FP8: 1, FMT_INT4: 0.5}[fmt]

    def elem_bytes(self, model_bytes: int) -> float:
        """Bytes a layer weight element streams (the schedule's prefetch counts)."""
        return self._bytes(self.fmt, model_bytes)

    def head_elem_bytes(self, model_bytes: int) -> float:
        return self._bytes(self.head_fmt, model_bytes)

    @property
    def chunk_cap(self) -> int:
        """GK: the widest chunk (columns) an int4 tile may load so that it lies in one group (the
        largest power of 2 dividing the group size); NO_CAP otherwise."""
        if self.fmt != FMT_INT4:
            return NO_CAP
        g = self.group & -self.group
        return min(g, NO_CAP)


def data_of(t):
    """The tensor a linear weight's GEMV streams: the tensor itself, FP8's data, int4's qweight."""
    if isinstance(t, torch.Tensor):
        return t
    return t.qweight if hasattr(t, "qweight") else t.data


def _one(t, dt: torch.dtype):
    """(FMT, None) for one linear weight, or (None, why)."""
    if isinstance(t, torch.Tensor):
        if t.dtype != dt or t.dim() != 2 or not t.is_contiguous():
            return None, f"a {t.dtype} tensor that is not a contiguous 2-D {dt} one"
        return FMT_MODEL, None
    if hasattr(t, "qweight"):                                    # int4 (model/quant/int4.py)
        if t.perm is not None:
            return None, "int4 act-order (perm): not supported by the persistent step (each chunk would gather " \
                         "its activation columns)"
        if t.group_size % 16:
            return None, f"int4 group_size {t.group_size} (a multiple of 16 only)"
        if not t.is_contiguous():
            return None, "int4 tensors that are not contiguous"
        return FMT_INT4, None
    if hasattr(t, "data") and hasattr(t, "scale") and hasattr(t, "block"):    # FP8 (model/quant/fp8.py)
        if t.block is not None:
            return None, f"FP8 block scales {t.block} (per-channel / per-tensor scales only)"
        if t.data.dtype != torch.float8_e4m3fn or not t.is_contiguous():
            return None, "FP8 tensors that are not contiguous e4m3"
        return FMT_FP8, None
    return None, f"a {type(t).__name__}"


def weight_format(weights) -> WeightFormat | str:
    """The format of `weights` (a ModelWeights, read by attribute), or why the step cannot run it
    (one line naming the field)."""
    dt = weights.embed.dtype
    lin = [(f"layers[{i}].{name}", getattr(layer, name)) for i, layer in enumerate(weights.layers)
           for name in ("qkv", "o", "gate_up", "down")]
    fmts = set()
    for name, t in lin + [("lm_head", weights.lm_head)]:
        f, why = _one(t, dt)
        if why is not None:
            return f"weights: {name} is {why}"
        if name != "lm_head":
            fmts.add(f)
    if len(fmts) != 1:
        return f"weights: the layers mix {sorted(FORMAT_NAMES[f] for f in fmts)} linear weights (one format only)"
    fmt = fmts.pop()
    head_fmt = _one(weights.lm_head, dt)[0]
    if head_fmt not in (FMT_MODEL, fmt):
        return f"weights: lm_head is {FORMAT_NAMES[head_fmt]}, the layers {FORMAT_NAMES[fmt]}"
    quant = [t for _, t in lin] + ([weights.lm_head] if head_fmt != FMT_MODEL else [])
    if fmt == FMT_MODEL:
        return WeightFormat(fmt, head_fmt)
    dtypes = {t.scale.dtype for t in quant}
    if len(dtypes) != 1:
        return f"weights: scales in {sorted(map(str, dtypes))} (one dtype only)"
    if fmt == FMT_FP8:
        return WeightFormat(fmt, head_fmt, scale_dtype=dtypes.pop())
    groups = {t.group_size for t in quant}
    if len(groups) > 1 and all(t.group_size == t.shape[1] for t in quant):
        groups = {PER_CHANNEL}                                   # per channel: one group of each K
    zeros = {t.zero is not None for t in quant}
    if len(groups) != 1:
        return f"weights: int4 group sizes {sorted(groups)} (one only)"
    if len(zeros) != 1:
        return "weights: int4 zero points on some weights only (all or none)"
    return WeightFormat(fmt, head_fmt, group=groups.pop(), has_zero=zeros.pop(), scale_dtype=dtypes.pop())


__all__ = ["FMT_FP8", "FMT_INT4", "FMT_MODEL", "FORMAT_NAMES", "NO_CAP", "PER_CHANNEL", "WeightFormat", "data_of", "weight_format"]
