"""Greedy token choice: the row-wise argmax of logits in two passes over vocabulary chunks.

torch.argmax over a [B, 128k] row reduces each row in one thread block: at decode batch sizes
that is a few blocks on a GPU of 132 SMs (30-36 us a step on the H200 at bs 1). Here pass one
takes the maximum and its first index per (row, chunk of CHUNK ids), B x ceil(V / CHUNK)
programs; pass two picks per row the first chunk holding the row's maximum. The result is
torch.argmax's: the lowest id among equal maxima (within a chunk by tl.argmax's left tie break,
across chunks by taking the first). A row whose values are all -inf gives id 0, as torch does.
NaN logits give an unspecified id (torch returns the first NaN's).

CUDA tensors only go through the kernels (graph-capturable: no host sync; two small scratch
tensors allocated per call, from the graph pool under capture); elsewhere `greedy_tokens` calls
torch.argmax unless `kernel=True` (the CPU tests run the kernels under TRITON_INTERPRET=1).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 4096


@triton.jit(do_not_specialize=["stride", "vocab", "n_chunks"])
def _chunk_max(x_ptr, stride, vocab, n_chunks, val_ptr, idx_ptr, CHUNK: tl.constexpr):
    r, c = tl.program_id(0), tl.program_id(1)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    v = tl.load(x_ptr + r.to(tl.int64) * stride + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
    m = tl.max(v, axis=0)
    i = tl.argmax(v, axis=0)
    tl.store(val_ptr + r * n_chunks + c, m)
    tl.store(idx_ptr + r * n_chunks + c, (i + c * CHUNK).to(tl.int64))


@triton.jit(do_not_specialize=["n_chunks"])
def _pick(val_ptr, idx_ptr, n_chunks, out_ptr, CB: tl.constexpr):
    r = tl.program_id(0)
    offs = tl.arange(0, CB)
    v = tl.load(val_ptr + r * n_chunks + offs, mask=offs < n_chunks, other=float("-inf"))
    c = tl.argmax(v, axis=0)
    tl.store(out_ptr + r, tl.load(idx_ptr + r * n_chunks + c))


def greedy_tokens(logits: torch.Tensor, out: torch.Tensor, *, kernel: bool | None = None,
                  chunk: int = CHUNK) -> torch.Tensor:
    """out[r] = argmax(logits[r]) (lowest id among ties). logits [B, V] float32 / bf16 / fp16
    (last dim contiguous; rows may be strided), out [B] int64 on the same device; returns out.
    kernel: force the Triton passes (default: on CUDA only); chunk: ids per program (a power of
    two)."""
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"logits: expected [B, V] with a contiguous last dim, got {tuple(logits.shape)} "
                         f"strides {logits.stride()}")
    b, vocab = logits.shape
    if out.shape != (b,) or out.dtype != torch.int64 or out.device != logits.device or not out.is_contiguous():
        raise ValueError(f"out: expected a contiguous [{b}] int64 on {logits.device}, got {tuple(out.shape)} "
                         f"{out.dtype} on {out.device} strides {out.stride()}")
    if chunk < 16 or chunk & (chunk - 1):
        raise ValueError(f"chunk: must be a power of two >= 16, got {chunk}")
    if kernel is None:
        kernel = logits.is_cuda
    if not kernel:
        return out.copy_(torch.argmax(logits, dim=-1))
    if b == 0:
        return out
    n_chunks = triton.cdiv(vocab, chunk)
    vals = torch.empty((b, n_chunks), dtype=torch.float32, device=logits.device)
    idx = torch.empty((b, n_chunks), dtype=torch.int64, device=logits.device)
    _chunk_max[(b, n_chunks)](logits, logits.stride(0), vocab, n_chunks, vals, idx, CHUNK=chunk, num_warps=8)
    _pick[(b,)](vals, idx, n_chunks, out, CB=max(16, triton.next_power_of_2(n_chunks)), num_warps=1)
    return out


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """greedy_tokens into a new [B] int64 tensor (== torch.argmax(logits, dim=-1))."""
    return greedy_tokens(logits, torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device))


__all__ = ["greedy_tokens", "argmax_rows", "CHUNK"]
