"""The greedy token: torch.argmax(logits, dim=-1) as a chunked two-pass Triton reduction (capturable).

    argmax_into(logits, out)                  # out [R] int64 <- torch.argmax(logits, dim=-1)
    argmax_into(logits, out, top=top)         # and top [R] float32 <- the row maxima
    argmax_into(logits, out, ids=ids)         # out <- ids[torch.argmax(logits, dim=-1)] (a vocabulary map)

torch.argmax runs one thread block per row: over a 128k vocabulary 30-36 us a decode step on an
H200 at batch 1 (0.7% of an 8B step, ~7% of a tiny one's). Here the row is split in chunks:

  _chunks   grid (R, S): chunk c of row r (CHUNK ids) -> its max and the lowest id holding it,
            float32 [R, S] / int64 [R, S] scratch
  _rows     grid (R,): the S chunk results of a row -> out[r] (and top[r])

One rule, `first_max`, in both passes and in kernels/logits_process.py's chunked draw: a NaN is
above everything (the row's first NaN wins), otherwise the maximum, lowest id among ties, so
-0.0 ties +0.0 and a row of -inf gives 0: torch.argmax's answer, bit for bit (bf16 / fp16
values are compared in float32, which keeps their order and ties). No host sync; the scratch is
allocated per call with shapes fixed by (R, V) (inside a graph, the graph's pool holds it).

Where Triton cannot run over the tensor (a CPU tensor without TRITON_INTERPRET=1: the kernels
are GPU JITFunctions), argmax_into calls torch.argmax itself: the same ids.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from graphrt.kernels.launch import pdl_options, pdl_prologue, use_pdl

CHUNK = 2048       # ids per pass-1 program on the GPU (H200, bf16, V = 128256: 2.3 / 4.7 / 14.6 us at
                   # R = 1 / 16 / 80; 4096: 2.5 / 4.7 / 15.3 with 8 warps)
BIG = tl.constexpr(2 ** 62)                    # above every int64 token id: no lane holds the max
_BIG32 = tl.constexpr(2 ** 31 - 1)             # the same above int32 ids (a chunk's: 25% faster at R = 80)
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def first_max(v, ids, valid, BIG: tl.constexpr):
    """torch.argmax's rule over the `valid` lanes of float32 v [N] with ids [N] (int32 or int64,
    BIG above them all): (the max, NaN if any valid lane is NaN; the lowest id holding it, the
    lowest NaN id if any). No valid lane: (-inf, BIG)."""
    nan = valid & (v != v)
    any_nan = tl.max(nan.to(tl.int32), axis=0) > 0
    w = tl.where(valid & (v == v), v, float("-inf"))
    m = tl.max(w, axis=0)
    hit = tl.where(any_nan, nan, valid & (w == m))
    tok = tl.min(tl.where(hit, ids, BIG), axis=0)
    return tl.where(any_nan, float("nan"), m), tok


@triton.jit
def _chunks(logits_ptr, l_stride, V, S, xmax_ptr, xarg_ptr, CHUNK: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    valid = offs < V
    v = tl.load(logits_ptr + r * l_stride + offs, mask=valid, other=float("-inf")).to(tl.float32)
    m, tok = first_max(v, offs, valid, _BIG32)
    tl.store(xmax_ptr + r * S + c, m)
    tl.store(xarg_ptr + r * S + c, tok.to(tl.int64))


@triton.jit
def _rows(xmax_ptr, xarg_ptr, S, out_ptr, out_stride, top_ptr, ids_ptr, TOP: tl.constexpr, MAP: tl.constexpr,
          SP2: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    r = tl.program_id(0).to(tl.int64)
    sj = tl.arange(0, SP2)
    sm = sj < S
    xm = tl.load(xmax_ptr + r * S + sj, mask=sm, other=float("-inf"))
    m, tok = first_max(xm, tl.load(xarg_ptr + r * S + sj, mask=sm, other=0), sm, BIG)
    if MAP:                                      # tok < V always: a row's lanes are all valid ids
        tok = tl.load(ids_ptr + tok)
    tl.store(out_ptr + r * out_stride, tok)
    if TOP:
        tl.store(top_ptr + r, m)


def chunk_size(vocab: int, device: torch.device, chunk: int | None, gpu_chunk: int = CHUNK) -> int:
    """Ids per chunk: `chunk` if given, else gpu_chunk on the GPU; in the CPU interpreter (whose
    cost is per program) up to 4096, at most the vocabulary's next power of two."""
    if chunk is not None:
        return chunk
    return gpu_chunk if device.type == "cuda" else min(4096, triton.next_power_of_2(vocab))


def triton_runs_on(t: torch.Tensor) -> bool:
    """Can graphrt's Triton kernels run over tensor t: a CUDA tensor, or the interpreter is on?"""
    return t.device.type == "cuda" or isinstance(_chunks, InterpretedFunction)


def _check(logits: torch.Tensor, out: torch.Tensor, top: torch.Tensor | None, chunk: int | None,
           ids: torch.Tensor | None = None) -> None:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.dtype not in _DTYPES:
        got = f"{tuple(logits.shape)} {logits.dtype}" if isinstance(logits, torch.Tensor) else repr(logits)
        raise ValueError(f"logits: expected [R, V] float32 / bfloat16 / float16, got {got}")
    r, v = logits.shape
    if v < 1 or (r > 1 and (logits.stride(1) != 1 or logits.stride(0) < v)) or (r == 1 and logits.stride(1) != 1):
        raise ValueError(f"logits: expected rows contiguous along the vocabulary (stride(1) == 1, "
                         f"stride(0) >= V = {v}), got shape {tuple(logits.shape)} strides {logits.stride()}")
    for name, t, dt, want in (("out", out, torch.int64, (r,)), ("top", top, torch.float32, (r,)),
                              ("ids", ids, torch.int64, (v,))):
        if t is None:
            continue
        contiguous = name != "out" or r < 2        # out: any stride (a column of a proposals table)
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != want or t.dtype != dt \
                or (contiguous and not t.is_contiguous()) or t.device != logits.device:
            got = f"{tuple(t.shape)} {t.dtype} on {t.device}" if isinstance(t, torch.Tensor) else repr(t)
            kind = "a contiguous" if name != "out" else "an"
            raise ValueError(f"{name}: expected {kind} [{want[0]}] {dt} tensor on {logits.device}, got {got}")
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 16
                              or chunk & (chunk - 1)):
        raise ValueError(f"chunk: expected a power of two >= 16, got {chunk!r}")


def argmax_into(logits: torch.Tensor, out: torch.Tensor, *, top: torch.Tensor | None = None,
                chunk: int | None = None, ids: torch.Tensor | None = None) -> torch.Tensor:
    """out <- torch.argmax(logits, dim=-1), the same ids (ids[...] of them with a map); returns out.

    Parameters
    ----------
    logits : [R, V] float32, bfloat16 or float16; rows may be a strided view (stride(1) == 1,
        stride(0) >= V).
    out : [R] int64 on logits' device, any stride (a column of a [R, k] table): the lowest id of
        each row's maximum (the first NaN of a row holding one; 0 for a row of -inf).
    top : optional [R] float32, contiguous: the row maxima (NaN for a row holding one).
    chunk : ids per pass-1 program (a power of two; default CHUNK on the GPU).
    ids : optional [V] int64, contiguous: out[r] = ids[that id] (an EAGLE-3 head's draft
        vocabulary -> target ids), in the same launch.

    Capturable: two launches, no host sync, scratch shapes fixed by (R, V). Raises ValueError
    naming the argument for a wrong shape, dtype, layout or device.
    """
    _check(logits, out, top, chunk, ids)
    r, v = logits.shape
    if r == 0:
        return out
    if not triton_runs_on(logits):                     # a CPU tensor, kernels compiled for a GPU
        best = torch.argmax(logits, dim=-1)
        out.copy_(best if ids is None else ids[best])
        if top is not None:
            top.copy_(logits.max(dim=-1).values)
        return out
    ch = chunk_size(v, logits.device, chunk)
    s = triton.cdiv(v, ch)
    xmax = torch.empty((r, s), dtype=torch.float32, device=logits.device)     # chunk maxima
    xarg = torch.empty((r, s), dtype=torch.int64, device=logits.device)       # their lowest ids
    pdl = use_pdl(logits)
    opts = {"PDL": pdl, **pdl_options(pdl), **({"num_warps": 4} if logits.device.type == "cuda" else {})}
    _chunks[(r, s)](logits, logits.stride(0), v, s, xmax, xarg, CHUNK=ch, **opts)
    _rows[(r,)](xmax, xarg, s, out, out.stride(0) if r > 1 else 1, top if top is not None else xmax,
                ids if ids is not None else xarg, TOP=top is not None, MAP=ids is not None,
                SP2=triton.next_power_of_2(s), **opts)
    return out


__all__ = ["argmax_into", "first_max", "chunk_size", "triton_runs_on", "BIG", "CHUNK"]
