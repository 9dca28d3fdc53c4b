"""Allowed-token bitmasks applied to logits in place (graph-capturable).

    apply_token_mask(logits, bits, active)              # rows r of logits use slot r's mask
    apply_token_mask(logits, bits, active, slots=idx)   # row r uses slot idx[r]'s mask

logits [R, V] (float32 / bf16 / fp16, contiguous along V); bits [B, W] int32 with W =
ceil(V / 32): bit t % 32 of word t // 32 is 1 where token t is allowed (xgrammar's layout, so a
matcher's `fill_next_token_bitmask` row is copied as is); active [B] int32: nonzero where the
slot is constrained. For each active row every token whose bit is 0 becomes -inf; an inactive
row is not read nor written (one load of its flag). Tokens at or beyond W * 32 never occur
(W covers V).

grid (R, ceil(V / CHUNK)): one program per chunk of CHUNK logits of a row. No host sync, no
data-dependent shape. Where Triton cannot run over the tensor (a CPU tensor without
TRITON_INTERPRET=1) the same rule runs in torch.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from graphrt.kernels.launch import pdl_options, pdl_prologue, use_pdl

CHUNK = 4096                        # logits per program on the GPU (128 words of the mask)


def words(vocab: int) -> int:
    """Mask words (int32) per row for a vocabulary of `vocab` ids: ceil(vocab / 32)."""
    return (vocab + 31) // 32


@triton.jit
def _apply(logits_ptr, l_stride, bits_ptr, b_stride, active_ptr, slot_ptr, V,
           HAS_SLOT: tl.constexpr, CHUNK: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    srow = tl.load(slot_ptr + r).to(tl.int64) if HAS_SLOT else r
    if tl.load(active_ptr + srow) != 0:
        offs = c * CHUNK + tl.arange(0, CHUNK)
        valid = offs < V
        word = tl.load(bits_ptr + srow * b_stride + offs // 32, mask=valid, other=0)
        allowed = ((word >> (offs % 32)) & 1) != 0
        tl.store(logits_ptr + r * l_stride + offs, float("-inf"), mask=valid & ~allowed)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def reference_mask(logits: torch.Tensor, bits: torch.Tensor, active: torch.Tensor,
                   slots: torch.Tensor | None = None) -> torch.Tensor:
    """The rule in torch (the tests' reference and the CPU fallback): a new tensor."""
    r, v = logits.shape
    rows = torch.arange(r, device=logits.device) if slots is None else slots.to(torch.long)
    b = bits.index_select(0, rows)                                              # [R, W]
    tok = torch.arange(v, device=logits.device)
    allowed = ((b[:, tok // 32] >> (tok % 32)) & 1) != 0                        # [R, V]
    on = active.index_select(0, rows) != 0
    return torch.where(on[:, None] & ~allowed, torch.full_like(logits, float("-inf")), logits)


def apply_token_mask(logits: torch.Tensor, bits: torch.Tensor, active: torch.Tensor,
                     slots: torch.Tensor | None = None) -> torch.Tensor:
    """Set the logits of disallowed tokens of active rows to -inf, in place; returns logits.
    slots: [R] int64 (the logits' device), the mask row of each logits row (default: row r).
    ValueError naming the argument on a shape / dtype / device mismatch. Capturable."""
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"logits: expected [R, V] contiguous along V, got {tuple(logits.shape)} "
                         f"strides {logits.stride()}")
    r, v = logits.shape
    if bits.dim() != 2 or bits.dtype != torch.int32 or bits.shape[1] < words(v) or bits.stride(1) != 1:
        raise ValueError(f"bits: expected [B, >= {words(v)}] int32 contiguous, got {tuple(bits.shape)} "
                         f"{bits.dtype}")
    if active.dim() != 1 or active.dtype != torch.int32 or active.shape[0] != bits.shape[0]:
        raise ValueError(f"active: expected [{bits.shape[0]}] int32, got {tuple(active.shape)} {active.dtype}")
    if slots is None and r > bits.shape[0]:
        raise ValueError(f"logits: {r} rows, the mask has {bits.shape[0]} (pass slots)")
    if slots is not None and (slots.dim() != 1 or slots.shape[0] != r or (r and slots.stride(0) != 1)):
        raise ValueError(f"slots: expected [{r}] contiguous, got {tuple(slots.shape)} strides {slots.stride()}")
    for name, t in (("bits", bits), ("active", active), ("slots", slots)):
        if t is not None and t.device != logits.device:
            raise ValueError(f"{name}: on {t.device}, expected the logits' device {logits.device}")
    if r == 0:
        return logits
    if logits.device.type != "cuda" and not _interpreting():
        logits.copy_(reference_mask(logits, bits, active, slots))
        return logits
    chunk = CHUNK if logits.device.type == "cuda" else 1024
    pdl = use_pdl(logits)
    _apply[(r, triton.cdiv(v, chunk))](logits, logits.stride(0), bits, bits.stride(0), active,
                                      slots if slots is not None else active, v,
                                      HAS_SLOT=slots is not None, CHUNK=chunk, PDL=pdl, **pdl_options(pdl))
    return logits


__all__ = ["apply_token_mask", "reference_mask", "words", "CHUNK"]
