"""Fused logits processing, draw and log-probabilities over vocabulary chunks (graph-capturable).

The processed decode step in four launches instead of ~40 element-wise passes over [R, V]:

  _rules    grid (R,): the live token rules (logit bias, bans, min_tokens) of each row, summed
            into a zero [rows, V] float32 scratch `bias` (atomics; sparse: <= L entries a row)
  _penalize grid (R, S): per chunk of CHUNK tokens, one read of the logits, counts and prompt
            mask: repetition, presence, frequency penalties, + bias (read, then reset to zero,
            only in chunks that hold a rule id) -> x [R, V] float32; the chunk's max and its
            lowest arg-max; optionally the log-softmax partials of the raw logits (max, sum of exp)
  _second   grid (R, S): the row max from those partials; min_p (rows with min_p > 0 and
            temperature > 0: x = -inf where (x - max) / T < log min_p); for sampled rows the
            chunk's Gumbel-max candidate (kernels/sample.py's scores, noise and tie rule); the
            chunk's top-W candidates of the raw logits, pruned: only values reaching the row's
            W-th largest chunk max (a few extractions a chunk, not W); or the log-softmax
            partials and full top-W of any source row (`src`, or x / T)
  _finish   grid (R, S): the drawn token from the chunk candidates (or given), the log-softmax
            normaliser from the partials, the token's log-probability, its rank (atomic count
            over chunks of strictly larger log-probabilities, + 1), the top-W merge (chunk 0)
            and, for a decode step, the token, the draw index + 1 and the token count.

Numbers: x equals model/processing.py's float32 torch rule element for element (divisions are
IEEE-rounded, no fused multiply-add); duplicate rule ids are summed before they are added (a
float32 rounding apart from adding them one by one). Log-probabilities are (v - max) - log(sum),
torch's formula, with the sum taken chunk-wise (float32 rounding). Top-W ids are ordered by
value, ties to the lowest id (the keys pack the value's order bits and the id in one int64).
No host sync, no data-dependent shape; per-call scratch is allocated (the graph pool holds it).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphrt.kernels.argmax import BIG as _BIG, chunk_size, first_max   # _BIG: above every token id
from graphrt.kernels.launch import pdl_options, pdl_prologue, use_pdl
from graphrt.kernels.reference_sample import check_rows, check_source, check_state
from graphrt.kernels.sample import gumbel_score

CHUNK = 2048                                   # tokens per program on the GPU
_KMIN = tl.constexpr(-(2 ** 63) + 1)           # below every key: an empty top-W slot


@triton.jit
def _key(v, tok):
    """float32 v, int64 tok -> int64 keys ordered by v, then by lower tok."""
    bits = v.to(tl.int32, bitcast=True)
    o = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (o.to(tl.int64) << 32) | (0xFFFFFFFF - tok)


@triton.jit
def _unkey(k):
    o = (k >> 32).to(tl.int32)
    bits = o ^ ((o >> 31) & 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True), 0xFFFFFFFF - (k & 0xFFFFFFFF)


@triton.jit
def _stats(v, tok, valid, at, m_ptr, s_ptr, keys_ptr, W: tl.constexpr):
    """Log-softmax partials of one chunk (max, sum exp(v - max)) and its top-W keys at `at`."""
    v = tl.where(valid, v, float("-inf"))
    m = tl.max(v, axis=0)
    s = tl.sum(tl.where(v != float("-inf"), tl.exp(v - m), 0.0), axis=0)
    tl.store(m_ptr + at, m)
    tl.store(s_ptr + at, s)
    if W > 0:
        keys = tl.where(valid, _key(v, tok), _KMIN)
        for j in range(W):
            k = tl.max(keys, axis=0)
            tl.store(keys_ptr + at * W + j, k)
            keys = tl.where(keys == k, _KMIN, keys)


@triton.jit
def _rules(ids_ptr, vals_ptr, until_ptr, step_ptr, slot_ptr, bias_ptr, V, L,
           HAS_SLOT: tl.constexpr, LP2: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    r = tl.program_id(0)
    srow = tl.load(slot_ptr + r).to(tl.int64) if HAS_SLOT else r.to(tl.int64)
    j = tl.arange(0, LP2)
    inside = j < L
    ids = tl.load(ids_ptr + srow * L + j, mask=inside, other=-1)
    until = tl.load(until_ptr + srow * L + j, mask=inside, other=0)
    vals = tl.load(vals_ptr + srow * L + j, mask=inside, other=0.0)
    live = inside & (ids >= 0) & (ids < V) & (tl.load(step_ptr + r) < until)
    tl.atomic_add(bias_ptr + srow * V + tl.where(live, ids, 0), vals, mask=live)


@triton.jit
def _penalize(logits_ptr, l_stride, counts_ptr, c_stride, prompt_ptr, p_stride, params_ptr, pa_stride,
              ids_ptr, L, bias_ptr, slot_ptr, x_ptr, V, S, xmax_ptr, xarg_ptr, m_ptr, s_ptr, keys_ptr,
              rank_ptr, temp_ptr, HAS_SLOT: tl.constexpr, STATS: tl.constexpr, X_ALL: tl.constexpr,
              W: tl.constexpr, CHUNK: tl.constexpr, LP2: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    srow = tl.load(slot_ptr + r).to(tl.int64) if HAS_SLOT else r
    start = c * CHUNK
    offs = start + tl.arange(0, CHUNK)
    valid = offs < V
    v = tl.load(logits_ptr + r * l_stride + offs, mask=valid, other=float("-inf")).to(tl.float32)
    cnt = tl.load(counts_ptr + srow * c_stride + offs, mask=valid, other=0)
    prompt = tl.load(prompt_ptr + srow * p_stride + offs, mask=valid, other=0).to(tl.int32) != 0
    presence = tl.load(params_ptr + srow)
    frequency = tl.load(params_ptr + pa_stride + srow)
    rep = tl.load(params_ptr + 2 * pa_stride + srow)
    seen = cnt > 0
    y = tl.where(seen | prompt, tl.where(v > 0, tl.div_rn(v, rep), v * rep), v)
    y = y - presence * seen.to(tl.float32)
    y = y - frequency * cnt.to(tl.float32)
    j = tl.arange(0, LP2)
    ids = tl.load(ids_ptr + srow * L + j, mask=j < L, other=-1)
    if tl.max(((ids >= start) & (ids < start + CHUNK)).to(tl.int32), axis=0) > 0:
        b = tl.load(bias_ptr + srow * V + offs, mask=valid, other=0.0)
        y = tl.where(b != 0.0, y + b, y)
        tl.store(bias_ptr + srow * V + offs, tl.zeros_like(b), mask=valid & (b != 0.0))
    y = tl.where(valid, y, float("-inf"))
    if X_ALL:
        tl.store(x_ptr + r * V + offs, y, mask=valid)
    else:           # only sampled rows read x again (min_p, the Gumbel draw)
        if tl.load(temp_ptr + r) > 0:
            tl.store(x_ptr + r * V + offs, y, mask=valid)
    at = r * S + c
    m, arg = first_max(y, offs.to(tl.int64), valid, _BIG)           # kernels/argmax.py's rule
    tl.store(xmax_ptr + at, m)
    tl.store(xarg_ptr + at, arg)
    if STATS:
        _stats(v, offs.to(tl.int64), valid, at, m_ptr, s_ptr, keys_ptr, W)
        if c == 0:
            tl.store(rank_ptr + r, 0)


@triton.jit
def _pruned_top(v, tok, valid, at, S, m_ptr, row_m, keys_ptr, W: tl.constexpr, SP2: tl.constexpr,
                WP2: tl.constexpr):
    """The chunk's candidates for its row's top-W: only values >= T, the W-th largest chunk max
    of the row (at least W values reach T, so the top W all do; T = -inf with fewer than W
    chunks), at most W of them, in key order; the rest of its W slots _KMIN."""
    sj = tl.arange(0, SP2)
    mj = tl.load(m_ptr + row_m + sj, mask=sj < S, other=float("-inf"))
    ge = (mj[None, :] >= mj[:, None]) & (sj < S)[None, :]                   # [s, j]: m_j >= m_s
    reach = tl.sum(ge.to(tl.int32), axis=1)
    t = tl.max(tl.where((sj < S) & (reach >= W), mj, float("-inf")), axis=0)
    keys = tl.where(valid & (v >= t), _key(v, tok), _KMIN)
    n = tl.minimum(tl.sum((keys > _KMIN).to(tl.int32), axis=0), W)
    for j in range(0, n):
        k = tl.max(keys, axis=0)
        tl.store(keys_ptr + at * W + j, k)
        keys = tl.where(keys == k, _KMIN, keys)
    jj = tl.arange(0, WP2)
    tl.store(keys_ptr + at * W + jj, tl.full((WP2,), _KMIN, tl.int64), mask=(jj >= n) & (jj < W))


@triton.jit
def _second(x_ptr, x_stride, V, S, xmax_ptr, params_ptr, pa_stride, slot_ptr, temp_ptr, seed_ptr,
            step_ptr, score_ptr, sarg_ptr, m_ptr, s_ptr, keys_ptr, rank_ptr, raw_ptr, raw_stride,
            HAS_SLOT: tl.constexpr, CUT: tl.constexpr, DRAW: tl.constexpr, STATS: tl.constexpr,
            SRC_DIV: tl.constexpr, TOPK_RAW: tl.constexpr, W: tl.constexpr, CHUNK: tl.constexpr,
            SP2: tl.constexpr, WP2: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    at = r * S + c
    offs = c * CHUNK + tl.arange(0, CHUNK)
    valid = offs < V
    temp = tl.load(temp_ptr + r)
    safe_t = tl.where(temp > 0, temp, 1.0)
    top = 0.0
    if CUT or DRAW:
        sj = tl.arange(0, SP2)
        top = tl.max(tl.load(xmax_ptr + r * S + sj, mask=sj < S, other=float("-inf")), axis=0)
    cut = float("-inf")
    if CUT:
        srow = tl.load(slot_ptr + r).to(tl.int64) if HAS_SLOT else r
        min_p = tl.load(params_ptr + 3 * pa_stride + srow)
        cut = tl.where((min_p > 0) & (temp > 0), tl.log(tl.maximum(min_p, 1e-30)), float("-inf"))
    need = (cut > float("-inf")) | STATS
    if DRAW:
        need = need | (temp > 0)
    if need:
        y = tl.load(x_ptr + r * x_stride + offs, mask=valid, other=float("-inf")).to(tl.float32)
        if CUT:
            if cut > float("-inf"):
                y = tl.where(tl.div_rn(y - top, safe_t) < cut, float("-inf"), y)
                tl.store(x_ptr + r * x_stride + offs, y, mask=valid)
        tok = offs.to(tl.int64)
        if DRAW:
            if temp > 0:
                seed = tl.load(seed_ptr + r)
                t = tl.load(step_ptr + r).to(tl.int64)
                score = tl.where(valid, gumbel_score(y, top, safe_t, seed, t << 32, tok), float("-inf"))
                bm = tl.max(score, axis=0)
                tl.store(score_ptr + at, bm)
                tl.store(sarg_ptr + at, tl.min(tl.where((score == bm) & valid, tok, _BIG), axis=0))
        if STATS:
            src = tl.div_rn(y, safe_t) if SRC_DIV else y
            _stats(src, tok, valid, at, m_ptr, s_ptr, keys_ptr, W)
            if c == 0:
                tl.store(rank_ptr + r, 0)
    if TOPK_RAW:      # the raw logits' top-W candidates, pruned by _penalize's chunk maxima
        v = tl.load(raw_ptr + r * raw_stride + offs, mask=valid, other=float("-inf")).to(tl.float32)
        _pruned_top(v, offs.to(tl.int64), valid, at, S, m_ptr, r * S, keys_ptr, W, SP2, WP2)


@triton.jit
def _finish(src_ptr, src_stride, V, S, xmax_ptr, xarg_ptr, score_ptr, sarg_ptr, m_ptr, s_ptr, keys_ptr,
            temp_ptr, step_ptr, out_ptr, slot_ptr, live_ptr, counts_ptr, c_stride, tok_lp_ptr, rank_ptr,
            top_ids_ptr, top_vals_ptr, HAS_SLOT: tl.constexpr, TOKEN_IN: tl.constexpr,
            COUNT: tl.constexpr, SRC_DIV: tl.constexpr, W: tl.constexpr, CHUNK: tl.constexpr,
            SP2: tl.constexpr, SWP2: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    sj = tl.arange(0, SP2)
    sm = sj < S
    temp = tl.load(temp_ptr + r)
    safe_t = tl.where(temp > 0, temp, 1.0)
    if TOKEN_IN:
        tok = tl.load(out_ptr + r).to(tl.int64)
    else:   # greedy: torch.argmax's id (kernels/argmax.py); sampled: Gumbel-max
        _, tok = first_max(tl.load(xmax_ptr + r * S + sj, mask=sm, other=float("-inf")),
                           tl.load(xarg_ptr + r * S + sj, mask=sm, other=0), sm, _BIG)
        if temp > 0:
            sc = tl.load(score_ptr + r * S + sj, mask=sm, other=float("-inf"))
            bm = tl.max(sc, axis=0)
            bt = tl.min(tl.where(sm & (sc == bm), tl.load(sarg_ptr + r * S + sj, mask=sm, other=_BIG), _BIG),
                        axis=0)
            tok = tl.where(bt < _BIG, bt, tok)
    mj = tl.load(m_ptr + r * S + sj, mask=sm, other=float("-inf"))
    mx = tl.max(mj, axis=0)
    total = tl.sum(tl.where(mj > float("-inf"), tl.load(s_ptr + r * S + sj, mask=sm, other=0.0)
                            * tl.exp(mj - mx), 0.0), axis=0)
    log_z = tl.log(total)
    v_tok = tl.load(src_ptr + r * src_stride + tok).to(tl.float32)
    if SRC_DIV:
        v_tok = tl.div_rn(v_tok, safe_t)
    lp_tok = (v_tok - mx) - log_z
    offs = c * CHUNK + tl.arange(0, CHUNK)
    valid = offs < V
    v = tl.load(src_ptr + r * src_stride + offs, mask=valid, other=float("-inf")).to(tl.float32)
    if SRC_DIV:
        v = tl.div_rn(v, safe_t)
    above = tl.sum((valid & (((v - mx) - log_z) > lp_tok)).to(tl.int32), axis=0)
    tl.atomic_add(rank_ptr + r, above + (c == 0).to(tl.int32))
    if c == 0:
        tl.store(tok_lp_ptr + r, lp_tok)
        if not TOKEN_IN:
            tl.store(out_ptr + r, tok)
            tl.store(step_ptr + r, tl.load(step_ptr + r) + 1)
        if COUNT:
            srow = tl.load(slot_ptr + r).to(tl.int64) if HAS_SLOT else r
            live = tl.load(live_ptr + r).to(tl.int32)
            tl.atomic_add(counts_ptr + srow * c_stride + tok, live)
        if W > 0:
            kk = tl.arange(0, SWP2)
            keys = tl.load(keys_ptr + r * S * W + kk, mask=kk < S * W, other=_KMIN)
            for j in range(W):
                k = tl.max(keys, axis=0)
                val, tid = _unkey(k)
                tl.store(top_ids_ptr + r * W + j, tid)
                tl.store(top_vals_ptr + r * W + j, (val - mx) - log_z)
                keys = tl.where(keys == k, _KMIN, keys)


def _launch_opts(t: torch.Tensor) -> dict:
    """Launch options over tensor t: PDL (kernels/launch.py) and, on the GPU, 4 warps and no
    fused multiply-add (the torch rule's roundings)."""
    pdl = use_pdl(t)
    return {"PDL": pdl, **pdl_options(pdl), **({"num_warps": 4, "enable_fp_fusion": False}
                                                if t.device.type == "cuda" else {})}


class _Parts:
    """Per-call scratch of R rows over S chunks (the logits' device): xmax, score [R, S] float32
    (chunk max of x, best Gumbel score), xarg, sarg [R, S] int64 (their ids), m, s [R, S] float32
    (log-softmax partials), keys [R, S, W] int64 (top-W keys)."""

    def __init__(self, r: int, s: int, w: int, device):
        f32, i64 = dict(dtype=torch.float32, device=device), dict(dtype=torch.int64, device=device)
        self.xmax, self.score, self.m, self.s = (torch.empty((r, s), **f32) for _ in range(4))
        self.xarg, self.sarg = torch.empty((r, s), **i64), torch.empty((r, s), **i64)
        self.keys = torch.empty((r, s, max(w, 1)), **i64)


def _first(logits, counts, prompt, params, rule_ids, rule_vals, rule_until, bias, step, temperature, slots,
           chunk, stats: bool, width: int, rank, x_all: bool):
    """_rules + _penalize (raw log-softmax partials with `stats`; top-W keys never: the W slots
    of parts.keys are for _second) -> (x [R, V] float32, parts, S, CHUNK)."""
    r, v = logits.shape
    check_rows(r, logits=logits, step=step, temperature=temperature)
    check_state(counts, prompt, params, rule_ids, rule_vals, rule_until, bias)
    dev = logits.device
    ch = chunk_size(v, dev, chunk, CHUNK)
    s = triton.cdiv(v, ch)
    x = torch.empty((r, v), dtype=torch.float32, device=dev)
    parts = _Parts(r, s, width, dev)
    has_slot = slots is not None
    slot = slots if has_slot else step
    L = rule_ids.shape[1]
    lp2 = triton.next_power_of_2(max(L, 1))
    opts = _launch_opts(logits)
    _rules[(r,)](rule_ids, rule_vals, rule_until, step, slot, bias, v, L, HAS_SLOT=has_slot, LP2=lp2, **opts)
    _penalize[(r, s)](logits, logits.stride(0), counts, counts.stride(0), prompt.view(torch.uint8),
                      prompt.stride(0), params, params.stride(0), rule_ids, L, bias, slot, x, v, s,
                      parts.xmax, parts.xarg, parts.m, parts.s, parts.keys, rank if rank is not None else step,
                      temperature, HAS_SLOT=has_slot, STATS=stats, X_ALL=x_all, W=0, CHUNK=ch, LP2=lp2, **opts)
    return x, parts, s, ch


def process_logits(logits, counts, prompt, params, rule_ids, rule_vals, rule_until, bias, step, temperature,
                   *, slots=None, chunk: int | None = None) -> torch.Tensor:
    """Processed logits: logits [R, V] (any float dtype, rows contiguous) -> [R, V] float32.

    Row r reads state row slots[r] (slots [R] int64; None: row r) of counts [*, V] int32, prompt
    [*, V] bool, params [NUM_PARAMS, *] float32 (model/processing.py's rows), rule_ids [*, L]
    int64, rule_vals [*, L] float32, rule_until [*, L] int32 and bias [*, V] float32 (all zero;
    left all zero); step [R] int32 (draw index), temperature [R] float32 (0: no min_p).
    Capturable."""
    r, v = logits.shape
    if r == 0:
        return torch.empty((0, v), dtype=torch.float32, device=logits.device)
    x, parts, s, ch = _first(logits, counts, prompt, params, rule_ids, rule_vals, rule_until, bias, step,
                             temperature, slots, chunk, False, 0, None, True)
    slot = slots if slots is not None else step
    _second[(r, s)](x, v, v, s, parts.xmax, params, params.stride(0), slot, temperature, step, step,
                    parts.score, parts.sarg, parts.m, parts.s, parts.keys, step, x, v,
                    HAS_SLOT=slots is not None, CUT=True, DRAW=False, STATS=False, SRC_DIV=False,
                    TOPK_RAW=False, W=0, CHUNK=ch, SP2=triton.next_power_of_2(s), WP2=1,
                    **_launch_opts(x))
    return x


def process_draw(logits, counts, prompt, params, rule_ids, rule_vals, rule_until, bias, seed, step,
                 temperature, live, out, lp_token, lp_rank, lp_ids, lp_vals, *, source: str,
                 chunk: int | None = None) -> torch.Tensor:
    """A processed decode step over rows [0, R) of the state (no top-k / top-p): process as
    process_logits, draw each row's token into out [R] int64 (kernels/sample.py's unsorted
    rule: greedy rows the lowest arg-max, sampled rows Gumbel-max keyed by (seed [R] int64,
    step [R] int32, token id)), step += 1, log-probabilities of the drawn token into lp_token
    [R] float32 / lp_rank [R] int32 / lp_ids [R, W] int64 / lp_vals [R, W] float32 of source
    "raw" (the logits) or "processed" (x / T), counts[r, token] += live [R] bool. Returns x
    [R, V] float32 (after min_p; with source "raw" the rows of temperature 0 are not written:
    nothing reads them). Capturable."""
    r, v = logits.shape
    if r == 0:
        return torch.empty((0, v), dtype=torch.float32, device=logits.device)
    check_source(source)
    check_rows(r, temperature=temperature, seed=seed, live=live, out=out, lp_token=lp_token, lp_rank=lp_rank,
                lp_ids=lp_ids, lp_vals=lp_vals)
    w, raw = lp_ids.shape[1], source == "raw"
    x, parts, s, ch = _first(logits, counts, prompt, params, rule_ids, rule_vals, rule_until, bias, step,
                             temperature, None, chunk, raw, w, lp_rank, not raw)
    opts, sp2 = _launch_opts(x), triton.next_power_of_2(s)
    _second[(r, s)](x, v, v, s, parts.xmax, params, params.stride(0), step, temperature, seed, step,
                    parts.score, parts.sarg, parts.m, parts.s, parts.keys, lp_rank, logits, logits.stride(0),
                    HAS_SLOT=False, CUT=True, DRAW=True, STATS=not raw, SRC_DIV=not raw,
                    TOPK_RAW=raw and w > 0, W=w, CHUNK=ch, SP2=sp2, WP2=triton.next_power_of_2(max(w, 1)), **opts)
    src = logits if raw else x
    _finish[(r, s)](src, src.stride(0), v, s, parts.xmax, parts.xarg, parts.score, parts.sarg, parts.m, parts.s,
                    parts.keys, temperature, step, out, step, live.view(torch.uint8), counts, counts.stride(0),
                    lp_token, lp_rank, lp_ids, lp_vals, HAS_SLOT=False, TOKEN_IN=False, COUNT=True,
                    SRC_DIV=not raw, W=w, CHUNK=ch, SP2=sp2, SWP2=triton.next_power_of_2(max(s * w, 1)), **opts)
    return x


def logprobs_into(src, targets, lp_token, lp_rank, lp_ids, lp_vals, *, chunk: int | None = None) -> None:
    """Log-probabilities of src [R, V] (any float dtype, rows contiguous) at targets [R] int64:
    lp_token [R] float32, lp_rank [R] int32 (1 + the count strictly more likely), lp_ids [R, W]
    int64 / lp_vals [R, W] float32 (the top W, descending, ties to the lowest id). Capturable."""
    r, v = src.shape
    if r == 0:
        return
    check_rows(r, src=src, targets=targets, lp_token=lp_token, lp_rank=lp_rank, lp_ids=lp_ids, lp_vals=lp_vals)
    w, dev = lp_ids.shape[1], src.device
    ch = chunk_size(v, dev, chunk, CHUNK)
    s = triton.cdiv(v, ch)
    parts, sp2, opts = _Parts(r, s, w, dev), triton.next_power_of_2(s), _launch_opts(src)
    temp = torch.zeros(r, dtype=torch.float32, device=dev)                   # unread (no SRC_DIV)
    _second[(r, s)](src, src.stride(0), v, s, parts.xmax, temp, 0, targets, temp, targets, targets,
                    parts.score, parts.sarg, parts.m, parts.s, parts.keys, lp_rank, src, src.stride(0),
                    HAS_SLOT=False, CUT=False, DRAW=False, STATS=True, SRC_DIV=False, TOPK_RAW=False, W=w,
                    CHUNK=ch, SP2=sp2, WP2=1, **opts)
    _finish[(r, s)](src, src.stride(0), v, s, parts.xmax, parts.xarg, parts.score, parts.sarg, parts.m, parts.s,
                    parts.keys, temp, targets, targets, targets, targets, lp_rank, 0, lp_token, lp_rank,
                    lp_ids, lp_vals, HAS_SLOT=False, TOKEN_IN=True, COUNT=False, SRC_DIV=False, W=w,
                    CHUNK=ch, SP2=sp2, SWP2=triton.next_power_of_2(max(s * w, 1)), **opts)


__all__ = ["process_logits", "process_draw", "logprobs_into", "CHUNK"]
