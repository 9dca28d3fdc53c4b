"""Prefill attention over the paged KV cache: ragged prompts in one call, chunked, causal.

    chunks = plan_chunks(prompt_lens, max_tokens=8192)        # host: pure function
    for chunk in chunks:
        attn = PrefillAttention(config, device)                # once; reused for every chunk
        meta = attn.plan(chunk, block_table)                   # host metadata (+ FlashInfer plan)
        ... per layer: rope_append_prefill(qkv, ..., positions=meta.positions, rows=meta.rows)
        o = attn.run(q, kv_cache)                              # [T, Hq, D]

A chunk holds up to `max_tokens` query tokens from one or several prompts (a long prompt spans
several chunks, so activation memory stays bounded). The K/V of a chunk's tokens are written to
the cache before its attention runs; each query attends causally to every cached token of its
sequence up to its own position (FlashInfer's bottom-right causal alignment: query i of a
sequence with qo_len tokens and kv_len cached tokens sits at position kv_len - qo_len + i).

On CUDA: FlashInfer's `BatchPrefillWithPagedKVCacheWrapper` (planned on the host per chunk:
prefill is eager, outside the decode graphs). On CPU: a float32 torch reference over the same
metadata (tests; `device="cpu"` engines).

FP8 KV cache: prefill attention reads the chunk's own K/V back from the (e4m3) pages like every
earlier token's, so chunked prompts and cached prefixes see exactly what decode sees: FlashInfer
planned with kv_data_type=float8_e4m3fn, q multiplied by the k scale and the output by the v
scale on the device; the torch reference dequantizes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from graphrt.attention.flashinfer_import import import_flashinfer
from graphrt.config import RuntimeConfig
from graphrt.kernels.transfer import to_device

PREFILL_BACKENDS = ("fa2", "fa3", "auto")  # FlashInfer's names for its prefill kernel families


@dataclass(frozen=True)
class PrefillChunk:
    """One prefill call: its i-th sequence is prompt seqs[i] of the caller's list, and its query
    tokens are that prompt's positions [starts[i], starts[i] + lens[i]) (earlier positions are
    already in the cache when the chunk runs)."""

    seqs: tuple[int, ...]          # index into the caller's prompt list
    starts: tuple[int, ...]
    lens: tuple[int, ...]

    @property
    def num_tokens(self) -> int:
        return sum(self.lens)


def plan_chunks(prompt_lens, *, max_tokens: int, cached=None) -> list[PrefillChunk]:
    """Split ragged prompts into chunks of at most `max_tokens` query tokens, in order.

    prompt_lens: ints >= 1 (the tokens to prefill); cached: ints >= 0 already in the cache per
    prompt (default 0: positions start there). Every token appears in exactly one chunk; a
    prompt's pieces appear in increasing position order across chunks.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens: must be >= 1, got {max_tokens}")
    lens = [int(x) for x in prompt_lens]
    base = [0] * len(lens) if cached is None else [int(x) for x in cached]
    if any(x < 1 for x in lens):
        raise ValueError(f"prompt_lens: every prompt needs >= 1 token, got {lens}")
    chunks, cur, room = [], [], max_tokens
    for i, n in enumerate(lens):
        done = 0
        while done < n:
            take = min(n - done, room)
            cur.append((i, base[i] + done, take))
            done += take
            room -= take
            if room == 0:
                chunks.append(cur)
                cur, room = [], max_tokens
    if cur:
        chunks.append(cur)
    return [PrefillChunk(*(tuple(x) for x in zip(*c))) for c in chunks]


@dataclass(frozen=True)
class PrefillMeta:
    """Per-chunk metadata on the device. positions [T] int32 (token position in its sequence),
    rows [T] int32 (block-table row), qo_indptr [S+1] / kv_indptr [S+1] / kv_indices [pages] /
    kv_last_page_len [S] int32 (FlashInfer's paged CSR, up to each sequence's last query)."""

    positions: torch.Tensor
    rows: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_lens: tuple[int, ...]


class PrefillAttention:
    """Causal paged prefill attention for one model: one FlashInfer wrapper, planned per chunk."""

    def __init__(self, config: RuntimeConfig, device, *, workspace_mb: int = 256,
                 backend: str = "fa2"):
        """backend: FlashInfer's prefill kernel family, "fa2" (default: the same family as the
        tensor-core decode path; needs only FlashInfer's own headers) or "fa3" / "auto" (Hopper
        kernels; FlashInfer's JIT then needs the CUTLASS headers of the full wheel)."""
        if backend not in PREFILL_BACKENDS:
            raise ValueError(f"backend: {backend!r} is not one of {list(PREFILL_BACKENDS)}")
        if isinstance(workspace_mb, bool) or not isinstance(workspace_mb, int) or workspace_mb < 1:
            raise ValueError(f"workspace_mb: must be an int >= 1, got {workspace_mb!r}")
        self.config, self.device = config, torch.device(device)
        self._wrapper = None
        if self.device.type == "cuda":
            prefill = import_flashinfer("prefill attention on CUDA", "flashinfer.prefill")   # lazy: CUDA only
            ws = torch.empty(workspace_mb << 20, dtype=torch.uint8, device=self.device)
            self._wrapper = prefill.BatchPrefillWithPagedKVCacheWrapper(ws, config.kv_layout,
                                                                           backend=backend)
        self._meta: PrefillMeta | None = None

    def plan(self, chunk: PrefillChunk, block_table: torch.Tensor, rows=None) -> PrefillMeta:
        """Host metadata for `chunk` (block_table [R, W] int32, CPU or device: pass it on the host,
        a device table is read back; rows: the table row of each chunk sequence, default
        chunk.seqs), copied to the device in one non-blocking copy (the host does not wait for
        the stream: kernels/transfer.py). Raises ValueError if a sequence needs more
        pages than the table row holds or more tokens than max_context_len."""
        c = self.config
        table = block_table.cpu()
        rows = list(chunk.seqs if rows is None else rows)
        pos, tok_rows, qo, kv_ptr, idx, last, kv_lens = [], [], [0], [0], [], [], []
        for r, s, n in zip(rows, chunk.starts, chunk.lens):
            end = s + n
            if end > c.max_context_len:
                raise ValueError(f"prompt: {end} tokens, beyond max_context_len={c.max_context_len}")
            pages = -(-end // c.page_size)
            if pages > table.shape[1]:
                raise ValueError(f"block_table: row {r} holds {table.shape[1]} pages, "
                                 f"{end} tokens need {pages}")
            pos.append(torch.arange(s, end, dtype=torch.int32))
            tok_rows.append(torch.full((n,), r, dtype=torch.int32))
            qo.append(qo[-1] + n)
            idx.append(table[r, :pages])
            kv_ptr.append(kv_ptr[-1] + pages)
            last.append(end - (pages - 1) * c.page_size)
            kv_lens.append(end)
        i32 = lambda x: torch.as_tensor(x, dtype=torch.int32)  # noqa: E731
        parts = [torch.cat(pos), torch.cat(tok_rows), i32(qo), i32(kv_ptr), torch.cat(idx).to(torch.int32),
                 i32(last)]
        packed = to_device(torch.cat(parts), self.device)          # one copy, no host sync
        meta = PrefillMeta(*packed.split([p.numel() for p in parts]), tuple(kv_lens))
        if self._wrapper is not None:   # indptrs from the host (FlashInfer reads them there), indices
            self._wrapper.plan(parts[2], parts[3], meta.kv_indices, parts[5],   # on the device: no sync
                               c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size,
                               causal=True, q_data_type=c.torch_dtype, kv_data_type=c.kv_torch_dtype)
        self._meta = meta
        return meta

    def run(self, q: torch.Tensor, kv_cache, *, force_reference: bool = False) -> torch.Tensor:
        """q [T, Hq, D] (T = the planned chunk's tokens) -> [T, Hq, D] in q's dtype."""
        if self._meta is None:
            raise RuntimeError("PrefillAttention.run before plan()")
        if self._wrapper is not None and not force_reference:
            if kv_cache.fp8:   # scales folded in on the device: q * k_scale, out * v_scale
                k_scale, v_scale = kv_cache.kv_scales()
                return self._wrapper.run(q * k_scale, kv_cache.as_tuple()).mul_(v_scale)
            return self._wrapper.run(q, kv_cache.as_tuple())
        return reference_prefill(q, kv_cache, self._meta, self.config)


def reference_prefill(q: torch.Tensor, kv_cache, meta: PrefillMeta, config: RuntimeConfig) -> torch.Tensor:
    """Float32 torch causal paged attention over `meta` (any device); FP8 pages dequantized."""
    k_all, v_all = kv_cache.as_tuple()
    k_scale, v_scale = kv_cache.kv_scales()
    if config.kv_layout == "HND":
        k_all, v_all = k_all.transpose(1, 2), v_all.transpose(1, 2)
    hq, hkv, d = config.num_qo_heads, config.num_kv_heads, config.head_dim
    out = torch.empty_like(q)
    qo, kvp = meta.qo_indptr.tolist(), meta.kv_indptr.tolist()
    for i, kv_len in enumerate(meta.kv_lens):
        pages = meta.kv_indices[kvp[i]: kvp[i + 1]].long()
        k = k_all[pages].flatten(0, 1)[:kv_len].float() * k_scale         # [L, Hkv, D]
        v = v_all[pages].flatten(0, 1)[:kv_len].float() * v_scale
        qi = q[qo[i]: qo[i + 1]].float().view(-1, hkv, hq // hkv, d)      # [n, Hkv, G, D]
        n = qi.shape[0]
        s = torch.einsum("nhgd,lhd->hgnl", qi, k) / math.sqrt(d)
        q_pos = torch.arange(kv_len - n, kv_len, device=q.device)
        mask = torch.arange(kv_len, device=q.device)[None, :] > q_pos[:, None]   # [n, L]
        s = s.masked_fill(mask, float("-inf"))
        o = torch.einsum("hgnl,lhd->nhgd", torch.softmax(s, -1), v)
        out[qo[i]: qo[i + 1]] = o.reshape(n, hq, d).to(q.dtype)
    return out
