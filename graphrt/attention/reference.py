"""Independent oracles in pure torch, float32 accumulation, CPU or GPU.

- `reference_decode`: decode attention straight from block_table + seq_lens (no CSR metadata).
- `split_kv_decode`: executes a FlashInfer-style split-KV schedule (tiles of `kv_chunk_size`
  tokens per request, partial softmax per tile, log-sum-exp merge per request). Used to prove a
  planner's arrays cover every KV token exactly once.
"""
from __future__ import annotations

import math

import torch


def _token_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, layout: str):
    """[pages, P, H, D] views regardless of layout."""
    if layout == "HND":
        return k_cache.transpose(1, 2), v_cache.transpose(1, 2)
    return k_cache, v_cache


def reference_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_table: torch.Tensor, seq_lens: torch.Tensor, *, layout: str = "NHD",
                     sm_scale: float | None = None, rows_per_chunk: int = 16,
                     k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """Decode attention, one query token per request.

    q [B, Hq, D]; k_cache/v_cache paged (layout NHD/HND; any float dtype, float8_e4m3fn too);
    block_table [B, >=pages] int; seq_lens [B] int (0 -> zero output row); k_scale / v_scale:
    the caches' per-tensor scales (a stored k means k * k_scale; FP8 KV). Returns [B, Hq, D] in
    q.dtype, computed in float32.
    Reads seq_lens on the host (an oracle, not a graph path).
    """
    b, hq, d = q.shape
    kc, vc = _token_kv(k_cache, v_cache, layout)
    page_size, hkv = kc.shape[1], kc.shape[2]
    group = hq // hkv
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)
    lens = seq_lens.to("cpu", torch.int64)
    out = torch.zeros((b, hq, d), dtype=torch.float32, device=q.device)
    for r0 in range(0, b, rows_per_chunk):
        rows = slice(r0, min(b, r0 + rows_per_chunk))
        max_len = int(lens[rows].max()) if lens[rows].numel() else 0
        if max_len == 0:
            continue
        n_pages = -(-max_len // page_size)
        pages = block_table[rows, :n_pages].long()                       # [b', n_pages]
        # gather only each row's own pages: columns past a row's length may hold anything
        row_pages = (lens[rows] + page_size - 1) // page_size
        live = torch.arange(n_pages)[None, :] < row_pages[:, None]
        pages = pages.masked_fill(~live.to(pages.device), 0)
        k = kc[pages].flatten(1, 2)[:, :max_len].float() * k_scale        # [b', T, Hkv, D]
        v = vc[pages].flatten(1, 2)[:, :max_len].float() * v_scale
        qg = q[rows].float().view(-1, hkv, group, d)                      # [b', Hkv, G, D]
        s = torch.einsum("bhgd,bthd->bhgt", qg, k) * scale
        valid = torch.arange(max_len, device=q.device)[None, :] < lens[rows].to(q.device)[:, None]
        s = s.masked_fill(~valid[:, None, None, :], float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)                      # empty rows -> 0
        o = torch.einsum("bhgt,bthd->bhgd", p, v)
        out[rows] = o.reshape(-1, hq, d)
    return out.to(q.dtype)


def split_kv_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *,
                    indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor,
                    request_indices: torch.Tensor, kv_tile_indices: torch.Tensor,
                    o_indptr: torch.Tensor, kv_chunk_size: int, layout: str = "NHD",
                    sm_scale: float | None = None, k_scale=1.0, v_scale=1.0) -> torch.Tensor:
    """Run a split-KV schedule the way FlashInfer's kernels do, in float32 on q's device.

    Work tile t covers tokens [kv_tile_indices[t] * kv_chunk_size, +kv_chunk_size) of request
    request_indices[t] (clamped to its length). Each request r owns tiles o_indptr[r]:o_indptr[r+1]
    and merges them by log-sum-exp. Raises AssertionError if a tile is owned by a request other
    than the one that lists it (the schedule is inconsistent). k_scale / v_scale: as in
    reference_decode (floats or 0-d float32 tensors: a FP8 cache's per-tensor scales).
    """
    b, hq, d = q.shape
    kc, vc = _token_kv(k_cache, v_cache, layout)
    page_size, hkv = kc.shape[1], kc.shape[2]
    group = hq // hkv
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)
    indptr, indices = indptr.cpu().long(), indices.cpu().long()
    last, req, tile = last_page_len.cpu().long(), request_indices.cpu().long(), kv_tile_indices.cpu().long()
    o_indptr = o_indptr.cpu().long()
    out = torch.zeros((b, hq, d), dtype=torch.float32, device=q.device)
    for r in range(b):
        n_pages = int(indptr[r + 1] - indptr[r])
        kv_len = 0 if n_pages == 0 else (n_pages - 1) * page_size + int(last[r])
        pages = indices[indptr[r]: indptr[r + 1]].to(q.device)
        k_all = kc[pages].flatten(0, 1).float() * k_scale                  # [T, Hkv, D]
        v_all = vc[pages].flatten(0, 1).float() * v_scale
        qg = q[r].float().view(hkv, group, d)
        outs, lses = [], []
        for t in range(int(o_indptr[r]), int(o_indptr[r + 1])):
            assert int(req[t]) == r, f"tile {t} lists request {int(req[t])}, o_indptr gives it to {r}"
            lo = int(tile[t]) * kv_chunk_size
            hi = min(lo + kv_chunk_size, kv_len)
            if hi <= lo:
                continue
            s = torch.einsum("hgd,thd->hgt", qg, k_all[lo:hi]) * scale
            lse = torch.logsumexp(s, dim=-1)                                # [Hkv, G]
            outs.append(torch.einsum("hgt,thd->hgd", torch.softmax(s, -1), v_all[lo:hi]))
            lses.append(lse)
        if outs:
            lse = torch.stack(lses)                                         # [n, Hkv, G]
            w = torch.softmax(lse, dim=0)[..., None]
            out[r] = (torch.stack(outs) * w).sum(0).reshape(hq, d)
    return out.to(q.dtype)
