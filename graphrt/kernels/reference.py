"""The torch references of graphrt's Triton kernels: one implementation serving two uses.

- the kernel tests compare each Triton kernel (run by Triton's interpreter on a CPU) against the
  function of the same name here;
- the model's "torch" kernel set (kernels/ops.py: the default on a CPU) runs these instead of the
  interpreted kernels, so a CPU decodes at PyTorch's speed.

Same signatures and in-place contracts as the kernels they mirror, for model-dtype tensors (the
FP8 activation paths, `fp8=True` and ScaledAcc / SplitAcc inputs, are the Triton kernels' only:
a model with FP8 weights runs the Triton set). Math in float32, one rounding at each store, as
the kernels do. Device-error flags (kernels/flags.py) are OR-ed into `device_error` the same way.
Host syncs: none except boolean-mask writes (rope_append's K/V slots, prepare_metadata's CSR
indices), which a CPU does not mind. This module imports no Triton.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from graphrt.kernels.flags import ERR_KV_SLOT, ERR_PAGE_ID, ERR_POSITION, ERR_SEQ_LEN

E4M3_MAX = 448.0


def _plain(name: str, x, fp8: bool = False) -> torch.Tensor:
    if fp8 or not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: the torch kernels take model-dtype tensors only (FP8 activations, "
                         f"ScaledAcc / SplitAcc run the Triton kernels), got {type(x).__name__}"
                         + (" with fp8=True" if fp8 else ""))
    return x


def _store(y: torch.Tensor, out: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    if out is None:
        return y.to(dtype)
    out.copy_(y)
    return out


def _flag(device_error: torch.Tensor, bad: torch.Tensor, bit: int) -> None:
    """device_error[0] |= bit where any element of `bad` is set (no host read)."""
    device_error.view(-1)[:1].bitwise_or_(bad.any().to(torch.int32) * bit)


def rms_norm_f32(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., H] -> float32 x * rsqrt(mean(x^2) + eps) * weight."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor | None = None,
             fp8: bool = False) -> torch.Tensor:
    """kernels/norm.py's rms_norm: x [T, H] -> [T, H] (x's dtype unless `out`)."""
    _plain("x", x, fp8)
    return _store(rms_norm_f32(x, weight, eps), out, x.dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, *,
                 out: torch.Tensor | None = None, fp8: bool = False,
                 copy_to: torch.Tensor | None = None) -> torch.Tensor:
    """kernels/norm.py's add_rms_norm: residual [T, H] += x in place (the float32 sum, rounded
    once); returns rms_norm of the sum; copy_to (optional) receives the new residual."""
    _plain("x", x, fp8)
    s = residual.float() + x.float()
    residual.copy_(s)
    if copy_to is not None:
        copy_to.copy_(residual)
    return _store(rms_norm_f32(s, weight, eps), out, residual.dtype)


def embed_rms_norm(table: torch.Tensor, ids: torch.Tensor, weight: torch.Tensor, eps: float, *,
                   out: torch.Tensor | None = None, fp8: bool = False, residual: torch.Tensor | None = None,
                   copy_to: torch.Tensor | None = None) -> torch.Tensor:
    """kernels/norm.py's embed_rms_norm: rms_norm(table[ids.clamp_min(0)]); residual / copy_to
    (optional) receive the gathered rows."""
    _plain("table", table, fp8)
    rows = table.index_select(0, ids.long().clamp_min(0))             # [T, H]
    for t in (residual, copy_to):
        if t is not None:
            t.copy_(rows)
    return _store(rms_norm_f32(rows, weight, eps), out, table.dtype)


def silu_mul(x: torch.Tensor, *, out: torch.Tensor | None = None, fp8: bool = False) -> torch.Tensor:
    """kernels/activation.py's silu_mul: x [T, 2I] -> silu(x[:, :I]) * x[:, I:] [T, I]."""
    _plain("x", x, fp8)
    i = x.shape[1] // 2
    return _store(F.silu(x[:, :i].float()) * x[:, i:].float(), out, x.dtype)


def rotate(x: torch.Tensor, cos_sin: torch.Tensor, pos: torch.Tensor, norm: torch.Tensor | None,
           eps: float) -> torch.Tensor:
    """RoPE (HF rotate_half) of x [T, H, D] at positions pos [T] (rows of the [P, D] float32
    cos/sin table: cos half, then sin half), after a per-head RMSNorm when `norm` [D] is given.
    float32 [T, H, D]."""
    x = x.float()
    if norm is not None:
        x = rms_norm_f32(x, norm, eps)
    half = x.shape[-1] // 2
    cs = cos_sin.index_select(0, pos)
    c, s = cs[:, None, :half], cs[:, None, half:]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def _to_cache(x: torch.Tensor, dtype: torch.dtype, scale) -> torch.Tensor:
    """float32 -> the cache's dtype; e4m3 pages store clamp(x / scale, +-448)."""
    if dtype == torch.float8_e4m3fn:
        return (x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(dtype)
    return x.to(dtype)


def _rope_append(qkv, cos_sin, kv_cache, block_table, device_error, hq, positions, rows, live,
                 q_norm, k_norm, eps, q_out, kv_scale):
    kc, vc = kv_cache.as_tuple()
    nhd = kv_cache.layout == "NHD"
    d = cos_sin.shape[1]
    t = qkv.shape[0]
    hkv = (qkv.shape[1] // d - hq) // 2
    if qkv.dim() != 2 or qkv.shape[1] != (hq + 2 * hkv) * d or hkv < 1:
        raise ValueError(f"qkv: expected [T, (Hq + 2*Hkv) * D] with D = {d}, Hq = {hq}, got {tuple(qkv.shape)}")
    if (kc.dtype == torch.float8_e4m3fn) != (kv_scale is not None):
        raise ValueError(f"kv_scale: give a [2] float32 (k, v) scale tensor exactly when the cache is "
                         f"float8_e4m3fn (cache dtype {kc.dtype})")
    heads = _plain("qkv", qkv).float().reshape(t, hq + 2 * hkv, d)
    pos = positions.long()
    ok = (pos >= 0) & (pos < cos_sin.shape[0])
    pc = torch.where(ok, pos, 0)
    q = rotate(heads[:, :hq], cos_sin, pc, q_norm, eps) * ok[:, None, None]
    if q_out is None:
        q_out = torch.empty((t, hq, d), dtype=qkv.dtype, device=qkv.device)
    q_out.copy_(q)
    page_size = kc.shape[1] if nhd else kc.shape[2]
    row = rows.long()
    col = torch.where(ok, pos, 0) // page_size
    _flag(device_error, live & ~ok, ERR_POSITION)
    inside = live & ok & (col < block_table.shape[1]) & (row < block_table.shape[0])
    _flag(device_error, live & ok & ~inside, ERR_KV_SLOT)
    page = block_table[torch.where(inside, row, 0), torch.where(inside, col, 0)].long()
    good_page = (page >= 0) & (page < kc.shape[0])
    _flag(device_error, inside & ~good_page, ERR_PAGE_ID)
    write = inside & good_page
    if bool(write.any()):
        k = rotate(heads[write, hq:hq + hkv], cos_sin, pc[write], k_norm, eps)
        v = heads[write, hq + hkv:]
        ks, vs = (kv_scale[0], kv_scale[1]) if kv_scale is not None else (1.0, 1.0)
        p, slot = page[write], pos[write] % page_size
        if nhd:
            kc[p, slot] = _to_cache(k, kc.dtype, ks)
            vc[p, slot] = _to_cache(v, vc.dtype, vs)
        else:
            kc[p, :, slot] = _to_cache(k, kc.dtype, ks)
            vc[p, :, slot] = _to_cache(v, vc.dtype, vs)
    return q_out


def rope_append_decode(qkv: torch.Tensor, cos_sin: torch.Tensor, kv_cache, block_table: torch.Tensor,
                       seq_lens: torch.Tensor, device_error: torch.Tensor, *, num_q_heads: int,
                       q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None,
                       eps: float = 1e-6, q_out: torch.Tensor | None = None,
                       heads_per_program: int | None = None,
                       kv_scale: torch.Tensor | None = None) -> torch.Tensor:
    """kernels/rope_append.py's rope_append_decode: row b at position seq_lens[b] - 1 (padding
    rows, seq_len 0: q rotated at position 0, no K/V). heads_per_program: unused (a launch option)."""
    pos = (seq_lens.long() - 1).clamp_min(0)
    rows = torch.arange(qkv.shape[0], device=qkv.device)
    return _rope_append(qkv, cos_sin, kv_cache, block_table, device_error, num_q_heads, pos, rows,
                        seq_lens > 0, q_norm, k_norm, eps, q_out, kv_scale)


def rope_append_prefill(qkv: torch.Tensor, cos_sin: torch.Tensor, kv_cache, block_table: torch.Tensor,
                        positions: torch.Tensor, rows: torch.Tensor, device_error: torch.Tensor, *,
                        num_q_heads: int, q_norm: torch.Tensor | None = None,
                        k_norm: torch.Tensor | None = None, eps: float = 1e-6,
                        q_out: torch.Tensor | None = None, heads_per_program: int | None = None,
                        kv_scale: torch.Tensor | None = None) -> torch.Tensor:
    """kernels/rope_append.py's rope_append_prefill: token t at positions[t] of block-table row
    rows[t] (< 0: padding, no K/V written)."""
    return _rope_append(qkv, cos_sin, kv_cache, block_table, device_error, num_q_heads, positions,
                        rows.long().clamp_min(0), rows >= 0, q_norm, k_norm, eps, q_out, kv_scale)


def argmax_into(logits: torch.Tensor, out: torch.Tensor, *, top: torch.Tensor | None = None,
                chunk: int | None = None, ids: torch.Tensor | None = None) -> torch.Tensor:
    """kernels/argmax.py's argmax_into: out [R] <- torch.argmax(logits, -1) (ids[...] of it with
    a vocabulary map); top [R] float32 <- the row maxima. chunk: unused (a launch option)."""
    if logits.shape[0] == 0:
        return out
    best = torch.argmax(logits, dim=-1)
    out.copy_(best if ids is None else ids[best])
    if top is not None:
        top.copy_(logits.max(dim=-1).values)
    return out


def step_advance(out: torch.Tensor, tokens: torch.Tensor, seq_lens: torch.Tensor,
                 history: torch.Tensor | None = None, limit: torch.Tensor | None = None) -> None:
    """kernels/step_advance.py's step_advance, in place: rows at their limit (seq_lens >= limit
    > 0) keep everything; elsewhere tokens <- out, and where seq_lens > 0 also
    history[b, min(seq_lens[b], H - 1)] <- out[b] and seq_lens[b] += 1."""
    held = None if limit is None else (seq_lens > 0) & (limit > 0) & (seq_lens >= limit)
    live = seq_lens > 0 if held is None else (seq_lens > 0) & ~held
    tokens.copy_(out if held is None else torch.where(held, tokens, out))
    if history is not None and history.shape[0]:
        at = seq_lens.long().clamp(max=history.shape[1] - 1)[:, None]
        old = history.gather(1, at)
        history.scatter_(1, at, torch.where(live[:, None], out[:, None].to(history.dtype), old))
    seq_lens.add_(live.to(seq_lens.dtype))


def prepare_metadata(view, *, page_size: int, max_context_len: int, num_pool_pages: int,
                     checked_table: bool = False) -> None:
    """kernels/prepare.py's PrepareLaunch without a plan (spec None), on a BucketView in place:
    seq_lens outside [0, max_context_len] rewritten to 0 (ERR_SEQ_LEN); the paged-KV CSR
    (paged_kv_indptr, paged_kv_indices packed, paged_kv_last_page_len) with page ids outside
    the pool read as page 0 (ERR_PAGE_ID); checked_table: the used columns of block_table into
    block_table_checked the same way."""
    seq = view.seq_lens
    bad = (seq < 0) | (seq > max_context_len)
    _flag(view.device_error, bad, ERR_SEQ_LEN)
    seq.masked_fill_(bad, 0)
    pages = (seq + page_size - 1) // page_size                           # [B]
    table = view.block_table
    used = torch.arange(table.shape[1], device=table.device)[None, :] < pages[:, None]
    oob = used & ((table < 0) | (table >= num_pool_pages))
    _flag(view.device_error, oob, ERR_PAGE_ID)
    safe = table.masked_fill(oob, 0)
    if checked_table:
        view.block_table_checked.copy_(torch.where(used, safe, view.block_table_checked))
    view.paged_kv_indptr[0] = 0
    view.paged_kv_indptr[1:].copy_(pages.cumsum(0))
    view.paged_kv_last_page_len.copy_(torch.where(pages > 0, seq - (pages - 1) * page_size, 0))
    packed = safe[used]
    view.paged_kv_indices[:packed.shape[0]] = packed


__all__ = ["rms_norm", "add_rms_norm", "embed_rms_norm", "rms_norm_f32", "silu_mul", "rotate",
           "rope_append_decode", "rope_append_prefill", "argmax_into", "step_advance", "prepare_metadata"]
