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
TRITON_INTERPRET=1) the same rule runs in torch (kernels/reference_sample.py, the torch
kernel set's `apply_token_mask` and the tests' reference).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from graphrt.kernels.launch import pdl_options, pdl_prologue, use_pdl
from graphrt.kernels.reference_sample import check_mask_args, reference_mask, words

CHUNK = 4096                        # logits per program on the GPU (128 words of the mask)


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


def apply_token_mask(logits: torch.Tensor, bits: torch.Tensor, active: torch.Tensor,
                     slots: torch.Tensor | None = None) -> torch.Tensor:
    """Set the logits of disallowed tokens of active rows to -inf, in place; returns logits.
    slots: [R] int64 (the logits' device), the mask row of each logits row (default: row r).
    ValueError naming the argument on a shape / dtype / device mismatch. Capturable."""
    check_mask_args(logits, bits, active, slots)
    r, v = logits.shape
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
