"""Paged decode attention in one launch: split-KV with the merge done by the last split.

One query token per row: q [B, Hq, D] over the paged KV cache (graphrt PagedKVCache, NHD or
HND). GQA: one program holds the G = Hq / Hkv query heads of one KV head as a [BLOCK_M, D] tile
(BLOCK_M = max(16, G)), so each K/V block is read once per KV head.

Grid (B, Hkv, MAX_SPLITS), MAX_SPLITS static. Row b uses
    n_splits = min(MAX_SPLITS, cdiv(seq_lens[b], min_keys))
splits (computed on the device; every program of (b, kv head) computes the same value), each an
equal share of the row's BLOCK_N key blocks; programs past n_splits return at once. A row with
one split writes its output directly. Otherwise each split writes its normalised partial output
and log-sum-exp (log2 units) into the persistent float32 scratch, then adds 1 to the (b, kv head)
int32 counter (atomic, acq_rel, gpu scope); the program that sees n_splits - 1 arrives last,
merges every partial of (b, kv head), writes the output in q's dtype and sets the counter back
to 0, so the next launch (the next layer, the next replay of a CUDA graph) finds it zeroed.

Memory ordering of the merge: all threads of a split program store their partials, then a CTA
barrier (tl.debug_barrier: bar.sync), then one thread's atom.add.acq_rel.gpu. The barrier orders
every thread's stores before that release, and release is cumulative, so the stores are visible
at gpu scope before the count is. The last program's acquire (same atomic) is then broadcast to
its threads through shared memory and a barrier (Triton's lowering of a scalar atomic), and the
merge loads partials with cache_modifier=".cg" (L2, the point of coherence; no stale L1 line
from an earlier launch). Nothing waits on another program: correct for any scheduling order,
any number of resident CTAs, and sequential programs under TRITON_INTERPRET=1.

FP8 KV (float8_e4m3fn pages): the cache's [2] float32 (k, v) scale is read on the device; v_scale
multiplies the output once at the end. With a 16-bit q (fp8_dot="f16", the default) both dots run
in float16: q is multiplied by the logit scale (sm_scale * LOG2E * k_scale) and rounded to float16
once (clamped to +-65504), pages convert e4m3 -> float16 in registers (one cvt per two values on
sm_89+; e4m3 values are exact in float16), p is float16; accumulation in float32. fp8_dot="q"
converts pages to q's dtype instead and keeps the scale on the logits. Logits are in log2 units
(sm_scale * LOG2E) and use exp2.

No host sync, no device value in the grid, no allocation when out and scratch are given:
capturable in a CUDA graph. Scratch and counters are shared by successive launches on one
stream (every layer of a step, every bucket): never by two launches running concurrently.
PDL (kernels/launch.py) on Hopper+. Page ids are not checked here: the caller's block table
must hold valid pages for every position < seq_lens (graphrt passes the prepare kernel's
sanitised copy, view.block_table_checked).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from graphrt.kernels.launch import pdl_options, pdl_prologue, use_pdl

LOG2E = 1.4426950408889634
STAGES = 2                   # key-loop pipelining: H200, 8B bs 16 / 8k 170 -> 150 us a layer, bs 1 / 1k 7.3 -> 7.2
BLOCK_N = 64                 # keys per inner-loop block (32 for head_dim 256: shared memory)
BLOCK_N_FP8 = 128            # FP8 pages, as many bytes a block as bf16's 64: H200, 8B bs 16 / 8k 129.8 -> 101.6 us
                             # a layer, bs 1 / 8k 21.1 -> 16.2; 1B bs 16 / 8k 107.6 -> 70.3
MIN_KEYS_PER_SPLIT = 64      # a row gets at most cdiv(seq_len, this) splits
MERGE_ELEMS = 8192           # float32 partial elements one merge step holds in registers


@triton.jit(do_not_specialize=["bt_stride"])
def _decode_attention_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, bt_stride, lens_ptr, out_ptr, part_ptr, lse_ptr,
                   count_ptr, kvs_ptr, s_page, s_slot, s_head, qk_scale,
                   HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GP: tl.constexpr,
                   MAX_SPLITS: tl.constexpr, MIN_KEYS: tl.constexpr, MERGE_S: tl.constexpr,
                   PREC: tl.constexpr, KV_FP8: tl.constexpr, DOT_F16: tl.constexpr, DOT_F32: tl.constexpr,
                   PDL: tl.constexpr, STAGES: tl.constexpr):
    pdl_prologue(PDL)
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    sp = tl.program_id(2)
    G: tl.constexpr = HQ // HKV
    kv_len = tl.load(lens_ptr + b)
    n_blocks = tl.cdiv(kv_len, BLOCK_N)
    if MAX_SPLITS > 1:
        want = tl.minimum(tl.maximum(tl.cdiv(kv_len, MIN_KEYS), 1), MAX_SPLITS)
        per = tl.maximum(tl.cdiv(n_blocks, want), 1)            # key blocks per split
        n_splits = tl.maximum(tl.cdiv(n_blocks, per), 1)        # no empty split
    else:
        per = n_blocks
        n_splits = 1
    if sp < n_splits:
        m = tl.arange(0, BLOCK_M)
        d = tl.arange(0, D)
        row_ok = m < G
        h = kvh * G + m                                          # query head of tile row m
        q_off = (b * HQ + h).to(tl.int64) * D
        q = tl.load(q_ptr + q_off[:, None] + d[None, :], mask=row_ok[:, None], other=0.0)
        if KV_FP8:                                               # per-tensor scales, on the device
            qk_scale = qk_scale * tl.load(kvs_ptr)
        if DOT_F16:                                              # FP8 pages: dots in float16, the scale in q
            q = tl.minimum(tl.maximum(q.to(tl.float32) * qk_scale, -65504.0), 65504.0).to(tl.float16)
            qk_scale = 1.0
        if DOT_F32:
            q = q.to(tl.float32)
        lo = sp * per * BLOCK_N
        hi = tl.minimum(lo + per * BLOCK_N, kv_len)
        m_i = tl.full((BLOCK_M,), -1.0e30, tl.float32)
        l_i = tl.zeros((BLOCK_M,), tl.float32)
        acc = tl.zeros((BLOCK_M, D), tl.float32)
        n = tl.arange(0, BLOCK_N)
        for start in tl.range(lo, hi, BLOCK_N, num_stages=STAGES):   # STAGES > 1: loads pipelined
            pos = start + n                                      # [BLOCK_N] key positions
            key_ok = pos < hi
            page = tl.load(bt_ptr + b.to(tl.int64) * bt_stride + pos // PAGE, mask=key_ok, other=0)
            kv_off = page.to(tl.int64) * s_page + (pos % PAGE) * s_slot + kvh * s_head
            k = tl.load(k_ptr + kv_off[:, None] + d[None, :], mask=key_ok[:, None], other=0.0)
            v = tl.load(v_ptr + kv_off[:, None] + d[None, :], mask=key_ok[:, None], other=0.0)
            if KV_FP8:
                k = k.to(q.dtype)
                v = v.to(q.dtype)
            if DOT_F32:                                          # CPU interpreter: see decode_attention
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision=PREC).to(tl.float32) * qk_scale  # log2 units
            s = tl.where(key_ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC).to(tl.float32)
            m_i = m_new
        v_scale = 1.0
        if KV_FP8:
            v_scale = tl.load(kvs_ptr + 1)
        if n_splits == 1:                                        # the whole row: output directly
            o = acc / tl.maximum(l_i, 1e-30)[:, None] * v_scale
            tl.store(out_ptr + q_off[:, None] + d[None, :], o.to(out_ptr.dtype.element_ty),
                     mask=row_ok[:, None])
        else:
            row = b * HKV + kvh                                  # counter / scratch row
            slot = (row * MAX_SPLITS + sp) * G + m               # [BLOCK_M] partial rows
            tl.store(part_ptr + slot.to(tl.int64)[:, None] * D + d[None, :],
                     acc / tl.maximum(l_i, 1e-30)[:, None], mask=row_ok[:, None])
            tl.store(lse_ptr + slot, m_i + tl.log2(tl.maximum(l_i, 1e-30)), mask=row_ok)
            tl.debug_barrier()                                   # every thread's stores, then release
            done = tl.atomic_add(count_ptr + row, 1, sem="acq_rel", scope="gpu")
            if done == n_splits - 1:                             # last to arrive: merge
                _merge(part_ptr, lse_ptr, out_ptr, count_ptr, row, n_splits, b * HQ + kvh * G,
                       v_scale, G, D, GP, MAX_SPLITS, MERGE_S)


@triton.jit
def _merge(part_ptr, lse_ptr, out_ptr, count_ptr, row, n_splits, head0, v_scale,
           G: tl.constexpr, D: tl.constexpr, GP: tl.constexpr, MAX_SPLITS: tl.constexpr,
           MERGE_S: tl.constexpr):
    """out[head0 + g] = log-sum-exp merge of the n_splits partials of scratch row `row`."""
    g = tl.arange(0, GP)
    d = tl.arange(0, D)
    mx = tl.full((GP,), -1.0e30, tl.float32)
    wsum = tl.zeros((GP,), tl.float32)
    acc = tl.zeros((GP, D), tl.float32)
    for c0 in range(0, n_splits, MERGE_S):
        s = c0 + tl.arange(0, MERGE_S)
        ok = (s[:, None] < n_splits) & (g[None, :] < G)          # [MERGE_S, GP]
        slot = (row * MAX_SPLITS + s[:, None]) * G + g[None, :]
        lse = tl.load(lse_ptr + slot, mask=ok, other=float("-inf"), cache_modifier=".cg")
        part = tl.load(part_ptr + slot.to(tl.int64)[:, :, None] * D + d[None, None, :],
                       mask=ok[:, :, None], other=0.0, cache_modifier=".cg")
        m_new = tl.maximum(mx, tl.max(lse, axis=0))
        alpha = tl.exp2(mx - m_new)
        w = tl.exp2(lse - m_new[None, :])                        # [MERGE_S, GP], 0 where masked
        acc = acc * alpha[:, None] + tl.sum(w[:, :, None] * part, axis=0)
        wsum = wsum * alpha + tl.sum(w, axis=0)
        mx = m_new
    o = acc / tl.maximum(wsum, 1e-30)[:, None] * v_scale
    off = (head0 + g).to(tl.int64) * D
    tl.store(out_ptr + off[:, None] + d[None, :], o.to(out_ptr.dtype.element_ty), mask=(g < G)[:, None])
    tl.store(count_ptr + row, 0)                                 # zeroed for the next launch


@dataclass(frozen=True)
class DecodeScratch:
    """Persistent split-KV scratch of decode_attention (one device; allocated once, outside graphs).

    partial  [N, G, D] float32  normalised partial outputs; a launch of B rows with max_splits S
                                uses slots [0, B * Hkv * S): slot (b * Hkv + kv head) * S + split
    lse      [N, G]    float32  their log-sum-exp (log2 units)
    counters [R]       int32    arrivals per (b * Hkv + kv head) row, R >= B * Hkv; zero
                                between launches (each launch leaves them zero)
    """

    partial: torch.Tensor
    lse: torch.Tensor
    counters: torch.Tensor

    @classmethod
    def allocate(cls, launches, *, num_kv_heads: int, group: int, head_dim: int,
                 device) -> "DecodeScratch":
        """Scratch for every (batch, max_splits) pair in `launches` (each launch uses a prefix)."""
        launches = list(launches)
        slots = max([b * s for b, s in launches if s > 1] + [1]) * num_kv_heads
        rows = max([b for b, _ in launches] + [1]) * num_kv_heads
        return cls(torch.zeros((slots, group, head_dim), dtype=torch.float32, device=device),
                   torch.zeros((slots, group), dtype=torch.float32, device=device),
                   torch.zeros((rows,), dtype=torch.int32, device=device))

    def check(self, batch: int, num_kv_heads: int, group: int, head_dim: int, max_splits: int,
              device: torch.device) -> None:
        """ValueError unless a launch of `batch` rows with `max_splits` fits this scratch."""
        slots, rows = batch * num_kv_heads * max_splits, batch * num_kv_heads
        if (self.partial.device != device or self.partial.shape[1:] != (group, head_dim)
                or self.partial.shape[0] < slots or self.lse.shape[0] < slots
                or self.counters.shape[0] < rows or self.counters.dtype != torch.int32):
            raise ValueError(f"scratch: expected partial [>= {slots}, {group}, {head_dim}], lse "
                             f"[>= {slots}, {group}] float32 and counters [>= {rows}] int32 on "
                             f"{device}, got {tuple(self.partial.shape)}, {tuple(self.lse.shape)}, "
                             f"{tuple(self.counters.shape)} {self.counters.dtype} on {self.partial.device}")


NOMINAL_SMS = 132      # an H200: the split structure used where there is no GPU to ask (CPU)


def device_sms(device) -> int:
    """Streaming multiprocessors of a CUDA device, or NOMINAL_SMS elsewhere (the CPU interpreter
    then runs the same split structure as an H200)."""
    device = torch.device(device)
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else NOMINAL_SMS


def default_max_splits(sms: int, batch: int, num_kv_heads: int, max_context_len: int, *,
                       waves: int = 2, min_keys: int = MIN_KEYS_PER_SPLIT, cap: int = 64) -> int:
    """Static MAX_SPLITS of a bucket: about `waves` programs per SM over batch * Hkv (b, kv head)
    pairs, at most one split per `min_keys` keys of the longest context, at most `cap`."""
    want = triton.cdiv(waves * sms, max(1, batch * num_kv_heads))
    return max(1, min(want, triton.cdiv(max_context_len, min_keys), cap))


def decode_attention(q: torch.Tensor, kv_cache, block_table: torch.Tensor, seq_lens: torch.Tensor,
                     *, max_splits: int = 1, scratch: DecodeScratch | None = None,
                     out: torch.Tensor | None = None, min_keys: int | None = None,
                     block_n: int | None = None, stages: int | None = None,
                     fp8_dot: str = "f16") -> torch.Tensor:
    """q [B, Hq, D] -> [B, Hq, D] (q's dtype) decode attention over the paged cache, one launch.

    q: contiguous bfloat16 / float16 / float32 (the pages' dtype; any of the three over
    float8_e4m3fn pages). kv_cache: graphrt PagedKVCache (NHD or HND; FP8 pages with its [2]
    float32 `scale`). block_table [>= B, W] int32, seq_lens [B] int32 keys of each row including
    the current token (0 = padding row: zeros out), both on q's device. max_splits: static
    split-KV factor (see default_max_splits); > 1 needs `scratch` (DecodeScratch on q's device).
    out: [B, Hq, D] q.dtype contiguous (default: a new tensor). min_keys: a split covers at least
    this many keys (a multiple of block_n; default max(MIN_KEYS_PER_SPLIT, block_n)); block_n: keys
    per inner block (default BLOCK_N, BLOCK_N_FP8 over FP8 pages, 32 for D = 256); stages:
    software-pipelining depth of the key loop (1 = none; default STAGES);
    fp8_dot: "f16" or "q", the dots' input dtype over FP8 pages with a 16-bit q (see the module
    docstring; float32 q always computes in float32). Capturable with out and scratch given.
    """
    kc, vc = kv_cache.as_tuple()
    nhd = kv_cache.layout == "NHD"
    hkv, d = (kc.shape[2], kc.shape[3]) if nhd else (kc.shape[1], kc.shape[3])
    page_size = kc.shape[1] if nhd else kc.shape[2]
    fp8 = kc.dtype == torch.float8_e4m3fn
    q_ok = q.dtype in (torch.bfloat16, torch.float16, torch.float32) if fp8 else q.dtype == kc.dtype
    if q.dim() != 3 or q.shape[2] != d or q.shape[1] % hkv or not q.is_contiguous() or not q_ok \
            or q.device != kc.device:
        want = "bfloat16/float16/float32 (FP8 cache)" if fp8 else str(kc.dtype)
        raise ValueError(f"q: expected contiguous [B, Hq, {d}] {want} on {kc.device} with Hq a "
                         f"multiple of {hkv}, got {tuple(q.shape)} {q.dtype} on {q.device}")
    if fp8 and getattr(kv_cache, "scale", None) is None:
        raise ValueError("kv_cache: float8_e4m3fn pages need the cache's [2] float32 scale")
    b, hq, _ = q.shape
    if block_table.dim() != 2 or block_table.shape[0] < b or block_table.dtype != torch.int32 \
            or block_table.stride(1) != 1 or block_table.device != q.device:
        raise ValueError(f"block_table: expected [>= {b}, W] int32 (unit column stride) on {q.device}, "
                         f"got {tuple(block_table.shape)} {block_table.dtype} on {block_table.device}")
    if seq_lens.shape != (b,) or seq_lens.dtype != torch.int32 or seq_lens.device != q.device:
        raise ValueError(f"seq_lens: expected [{b}] int32 on {q.device}, got {tuple(seq_lens.shape)} "
                         f"{seq_lens.dtype} on {seq_lens.device}")
    if isinstance(max_splits, bool) or not isinstance(max_splits, int) or max_splits < 1:
        raise ValueError(f"max_splits: must be an int >= 1, got {max_splits!r}")
    block_n = block_n or ((BLOCK_N_FP8 if fp8 else BLOCK_N) if d <= 128 else 32)
    min_keys = max(MIN_KEYS_PER_SPLIT, block_n) if min_keys is None else min_keys
    stages = STAGES if stages is None else stages
    if block_n not in (16, 32, 64, 128) or min_keys < block_n or min_keys % block_n:
        raise ValueError(f"block_n, min_keys: block_n in (16, 32, 64, 128) and min_keys a multiple "
                         f"of it, got {block_n}, {min_keys}")
    if isinstance(stages, bool) or stages not in (1, 2, 3, 4):
        raise ValueError(f"stages: expected 1..4, got {stages!r}")
    if fp8_dot not in ("f16", "q"):
        raise ValueError(f"fp8_dot: expected 'f16' or 'q', got {fp8_dot!r}")
    group = hq // hkv
    if max_splits > 1:
        if not isinstance(scratch, DecodeScratch):
            raise ValueError(f"scratch: max_splits={max_splits} needs a DecodeScratch, got "
                             f"{type(scratch).__name__}")
        scratch.check(b, hkv, group, d, max_splits, q.device)
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or not out.is_contiguous() or out.device != q.device:
        raise ValueError(f"out: expected contiguous {tuple(q.shape)} {q.dtype} on {q.device}, got "
                         f"{tuple(out.shape)} {out.dtype} on {out.device}")
    if b == 0:
        return out
    gp = triton.next_power_of_2(group)
    # the interpreter's tl.dot multiplies bf16's raw uint16 storage (Triton 3.9): on CPU both dots
    # run in float32 (GPU: q's dtype, fp32 accumulation)
    cpu = q.device.type != "cuda"
    part, lse, count = (scratch.partial, scratch.lse, scratch.counters) if max_splits > 1 else (out, out, seq_lens)
    pdl = use_pdl(q)
    _decode_attention_kernel[(b, hkv, max_splits)](
        q, kc, vc, block_table, block_table.stride(0), seq_lens, out, part, lse, count,
        kv_cache.scale if fp8 else seq_lens, kc.stride(0), kc.stride(1 if nhd else 2),
        kc.stride(2 if nhd else 1), d ** -0.5 * LOG2E,
        HQ=hq, HKV=hkv, D=d, PAGE=page_size, BLOCK_M=max(16, gp), BLOCK_N=block_n, GP=gp,
        MAX_SPLITS=max_splits, MIN_KEYS=min_keys, MERGE_S=max(1, min(triton.next_power_of_2(max_splits),
                                                                      MERGE_ELEMS // (gp * d))),
        PREC="ieee" if q.dtype == torch.float32 or cpu else "tf32", KV_FP8=fp8,
        DOT_F16=fp8 and fp8_dot == "f16" and q.dtype != torch.float32, DOT_F32=cpu, PDL=pdl,
        STAGES=stages, num_warps=4, **pdl_options(pdl))
    return out


__all__ = ["DecodeScratch", "decode_attention", "default_max_splits", "device_sms", "NOMINAL_SMS", "BLOCK_N", "MIN_KEYS_PER_SPLIT", "STAGES",
           "BLOCK_N_FP8"]
