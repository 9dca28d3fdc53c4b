"""The multi-query attention kernel's launch shapes and argument check, without Triton.

    splits = default_splits(device, batch, num_kv_heads, max_kv_len)      # static split-KV factor
    splits, block_n = piece_launch(device, q_tokens, group, num_kv_heads, max_kv_len)
    tile_t, block_m, tiles = query_tiles(q_tokens, group)

Pure host functions of shapes (kernels/multiquery_attention.py launches with them; the model,
its graphed prefill pieces and mixed chunks, and the speculative runners choose them when they
are built, whichever kernel set then runs the attention). `check_multiquery` is the contract both
implementations of multiquery_attention check (the Triton kernel and its torch reference in
kernels/reference_attention.py).
"""
from __future__ import annotations

import torch

MAX_TILE_ROWS = 128     # (token, head) rows of one program's query tile


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(n: int) -> int:
    """The smallest power of two >= n (n >= 1)."""
    return 1 << (n - 1).bit_length()


def default_splits(device: torch.device, batch: int, num_kv_heads: int, max_kv_len: int,
                   *, block_n: int = 64) -> int:
    """Static split count: about two waves of programs on the GPU (132 SMs on an H200 assumed
    from the device's count), at most one split per 4 key blocks; 1 on CPU."""
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    want = _cdiv(2 * sms, max(1, batch * num_kv_heads))
    return max(1, min(want, _cdiv(max_kv_len, 4 * block_n)))


def piece_block_n(q_tokens: int) -> int:
    """BLOCK_N (keys per loop iteration) for a prompt piece of q_tokens query tokens."""
    return 128 if q_tokens >= 64 else 64


def piece_launch(device: torch.device, q_tokens: int, group: int, num_kv_heads: int,
                 max_kv_len: int) -> tuple[int, int]:
    """(splits, block_n) of a captured prompt piece: q_tokens query tokens of one row, G = group
    query heads per KV head, keys up to max_kv_len. Measured on an H100 (Llama-3.2-1B heads, 16
    layers' distinct caches a graph, `tools/bench_prefill_attention.py --sweep`): at 64 and 128
    tokens 128-key blocks and about one wave of programs beat 64-key blocks and two waves at 0,
    2k and 4k cached keys (64 tokens after 4032: 25.2 against 34.6 us a layer, FlashInfer's
    batch prefill 25.5), since each program's few key blocks left its loads unpipelined and
    every split writes a partial the combine reads back. Outside 64..128 tokens: the earlier
    rule (64-key blocks below 64 tokens, two waves). One wave: as many splits as fill the SMs
    once without a partial second wave (tiles x KV heads x splits <= SMs; 8 and 4 splits of the
    1B shape's 16 and 32 tile-heads on 132 SMs, the sweep's fastest)."""
    block_n = piece_block_n(q_tokens)
    tiles = query_tiles(q_tokens, group)[2]
    if device.type != "cuda" or not 64 <= q_tokens <= 128:
        return default_splits(device, tiles, num_kv_heads, max_kv_len, block_n=block_n), block_n
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    cap = _cdiv(max_kv_len, 4 * block_n)                      # at most one split per 4 key blocks
    return max(1, min(sms // (tiles * num_kv_heads), cap)), block_n


def query_tiles(q_tokens: int, group: int) -> tuple[int, int, int]:
    """(tokens per tile, tile rows BLOCK_M, tiles per row) for Q = q_tokens query tokens and G =
    group query heads per KV head: one tile of all Q tokens while Q * G <= 128 rows (the verify
    step), else tiles of 128 // G tokens (a prefill chunk)."""
    if q_tokens < 1 or group < 1 or group > MAX_TILE_ROWS:
        raise ValueError(f"q_tokens, group: expected >= 1 and group <= {MAX_TILE_ROWS}, got {q_tokens}, {group}")
    if q_tokens * group <= MAX_TILE_ROWS:
        return q_tokens, max(16, _pow2(q_tokens * group)), 1
    tile_t = MAX_TILE_ROWS // group
    return tile_t, MAX_TILE_ROWS, _cdiv(q_tokens, tile_t)


def check_multiquery(q: torch.Tensor, kv_cache, block_table: torch.Tensor, kv_lens: torch.Tensor, *,
                     q_lens: torch.Tensor | None, splits, out: torch.Tensor | None, block_n=None,
                     num_warps=None, num_stages=None) -> torch.Tensor:
    """multiquery_attention's contract (kernels/multiquery_attention.py); returns `out`, or a new
    tensor like q. ValueError naming the argument."""
    kc, _ = kv_cache.as_tuple()
    nhd = kv_cache.layout == "NHD"
    hkv, d = (kc.shape[2], kc.shape[3]) if nhd else (kc.shape[1], kc.shape[3])
    fp8 = kc.dtype == torch.float8_e4m3fn
    q_ok = q.dtype in (torch.bfloat16, torch.float16, torch.float32) if fp8 else q.dtype == kc.dtype
    if q.dim() != 4 or q.shape[3] != d or q.shape[2] % hkv or not q.is_contiguous() or not q_ok:
        want = "bfloat16/float16/float32 (FP8 cache)" if fp8 else str(kc.dtype)
        raise ValueError(f"q: expected contiguous [B, Q, Hq, {d}] {want} with Hq a multiple of "
                         f"{hkv}, got {tuple(q.shape)} {q.dtype}")
    if fp8 and getattr(kv_cache, "scale", None) is None:
        raise ValueError("kv_cache: float8_e4m3fn pages need the cache's [2] float32 scale")
    b = q.shape[0]
    if block_table.dim() != 2 or block_table.shape[0] < b or block_table.dtype != torch.int32 \
            or block_table.stride(1) != 1:
        raise ValueError(f"block_table: expected [>= {b}, W] int32, got {tuple(block_table.shape)} "
                         f"{block_table.dtype}")
    if kv_lens.shape != (b,) or kv_lens.dtype != torch.int32:
        raise ValueError(f"kv_lens: expected [{b}] int32, got {tuple(kv_lens.shape)} {kv_lens.dtype}")
    if q_lens is not None and (not isinstance(q_lens, torch.Tensor) or q_lens.shape != (b,)
                               or q_lens.dtype != torch.int32 or q_lens.device != q.device):
        raise ValueError(f"q_lens: expected [{b}] int32 on {q.device}, got "
                         f"{getattr(q_lens, 'shape', q_lens)!r} {getattr(q_lens, 'dtype', '')}")
    if isinstance(splits, bool) or not isinstance(splits, int) or splits < 1:
        raise ValueError(f"splits: must be an int >= 1, got {splits!r}")
    for name, v, ok in (("block_n", block_n, (16, 32, 64, 128, 256)), ("num_warps", num_warps, (1, 2, 4, 8, 16)),
                        ("num_stages", num_stages, range(1, 9))):
        if v is not None and (isinstance(v, bool) or v not in ok):
            raise ValueError(f"{name}: expected one of {list(ok)} or None, got {v!r}")
    if out is None:
        return torch.empty_like(q)
    if out.shape != q.shape or out.dtype != q.dtype or not out.is_contiguous():
        raise ValueError(f"out: expected contiguous {tuple(q.shape)} {q.dtype}, got "
                         f"{tuple(out.shape)} {out.dtype}")
    return out


def check_query_layout(cache_lens: torch.Tensor, nq, q_lens: torch.Tensor | None, offset) -> int:
    """query_layout's contract (kernels/query_layout.py); returns B. ValueError naming the argument."""
    b = cache_lens.shape[0] if cache_lens.dim() == 1 else -1
    if b < 0 or cache_lens.dtype != torch.int32 or not cache_lens.is_contiguous():
        raise ValueError(f"cache_lens: expected a contiguous [B] int32 tensor, got {tuple(cache_lens.shape)} "
                         f"{cache_lens.dtype}")
    if isinstance(nq, bool) or not isinstance(nq, int) or nq < 1:
        raise ValueError(f"nq: must be an int >= 1, got {nq!r}")
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < 2 ** 30:
        raise ValueError(f"offset: must be an int in [0, 2**30), got {offset!r}")
    if q_lens is not None and (tuple(q_lens.shape) != (b,) or q_lens.dtype != torch.int32
                               or not q_lens.is_contiguous() or q_lens.device != cache_lens.device):
        raise ValueError(f"q_lens: expected a contiguous [{b}] int32 tensor on {cache_lens.device}, got "
                         f"{tuple(q_lens.shape)} {q_lens.dtype} on {q_lens.device}")
    return b


__all__ = ["MAX_TILE_ROWS", "default_splits", "piece_block_n", "piece_launch", "query_tiles", "check_multiquery",
           "check_query_layout"]
