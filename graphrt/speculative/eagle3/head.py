"""The EAGLE-3 head's forward over graphrt's kernels and its own paged KV cache.

Position t of a sequence pairs the target's hidden states at t (three layers, [3H]) with the
embedding of the token AFTER t; the head's output there predicts the token two places on. One
decoder layer:

    g = fc(h3)                                  (target path; a chain step uses its own h, no fc)
    x = cat(rms(embed(token), input_norm), rms(g, hidden_norm))                  [T, 2H]
    q, k, v = qkv(x); RoPE at t; k/v into the head's paged cache (rope_append_prefill)
    h = g + o(attention(q))          (g replaced by rms(g, hidden_norm) with norm_before_residual)
    h = h + down(silu(gate(rms(h))) * up(rms(h)))                         pre-norm h [T, H]
    logits = lm_head(rms(h, norm))                         [T, Vd] over the draft vocabulary

`extend` (the target-hidden path: after prefill and as draft-extend after a verify) and
`chain_step` (one draft token per row, fed its own pre-norm h) take fixed shapes, read lengths
only on the device and never sync the host: both can be captured in a CUDA graph. `prefill`
is the eager host loop over ragged prompts. Draft ids map to target ids through
`weights.draft_ids` (`to_target`).
"""
from __future__ import annotations

import torch

from graphrt.kernels.activation import silu_mul
from graphrt.kernels.multiquery_attention import multiquery_attention
from graphrt.kernels.norm import add_rms_norm, rms_norm
from graphrt.kernels.rope_append import rope_append_prefill
from graphrt.kernels.transfer import tensor_on
from graphrt.model.linear import linear
from graphrt.model.rope import cos_sin_cache

PREFILL_CHUNK = 16   # query tokens per multi-query tile in the eager prompt loop


class Eagle3Head:
    """config: Eagle3Config; weights: Eagle3Weights; target_embed: the target's [V, H]
    embedding table (used unless the head has its own); max_positions: rows of the RoPE table
    (pass the target's: head configs often say 2048)."""

    def __init__(self, config, weights, *, target_embed: torch.Tensor | None = None,
                 max_positions: int | None = None):
        embed = weights.embed if weights.embed is not None else target_embed
        want = (config.vocab_size, config.hidden_size)
        if embed is None or tuple(embed.shape) != want:
            raise ValueError(f"target_embed: expected the target's {list(want)} embedding table, got "
                             f"{None if embed is None else list(embed.shape)}")
        if embed.dtype != weights.dtype or embed.device != weights.device:
            raise ValueError(f"target_embed: {embed.dtype} on {embed.device}, the head is "
                             f"{weights.dtype} on {weights.device}")
        self.config, self.weights, self.embed = config, weights, embed
        self.max_positions = max_positions or config.max_position_embeddings
        self.cos_sin = cos_sin_cache(config, self.max_positions, weights.device)   # [P, D] float32

    @property
    def device(self) -> torch.device:
        return self.weights.device

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids (any shape) -> target ids (int64)."""
        return self.weights.draft_ids[draft_ids]

    def target_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """[..., Vd] -> [..., V] float32: the draft logits at their target ids, -inf elsewhere."""
        out = torch.full((*draft_logits.shape[:-1], self.config.vocab_size), float("-inf"),
                         dtype=torch.float32, device=draft_logits.device)
        out[..., self.weights.draft_ids] = draft_logits.float()
        return out

    # ---- the layer --------------------------------------------------------------------------
    def _layer(self, g, tokens, positions, rows, kv_cache, block_table, error, attend):
        """g [T, H], tokens [T] int64 -> (draft logits [T, Vd], pre-norm h [T, H]), model dtype."""
        w, c = self.weights, self.config
        eps, (t, h) = c.rms_norm_eps, g.shape
        x = torch.empty((t, 2 * h), dtype=g.dtype, device=g.device)
        rms_norm(self.embed[tokens.clamp_min(0)], w.input_norm, eps, out=x[:, :h])
        rms_norm(g, w.hidden_norm, eps, out=x[:, h:])
        residual = (x[:, h:] if c.norm_before_residual else g).clone()       # add_rms_norm writes it
        q = rope_append_prefill(linear(x, w.qkv), self.cos_sin, kv_cache, block_table, positions, rows,
                                error, num_q_heads=c.num_heads, eps=eps)        # [T, Hq, D]
        y = add_rms_norm(linear(attend(q), w.o), residual, w.post_attn_norm, eps)   # residual: g + attn
        out = add_rms_norm(linear(silu_mul(linear(y, w.gate_up)), w.down), residual, w.norm, eps)
        return linear(out, w.lm_head), residual                                  # residual: pre-norm h

    def _rows(self, g, tokens, cache_lens, kv_cache, block_table, error, splits):
        """g [B * Q, H], tokens [B, Q] at positions cache_lens[b] + j (-1 = padding row)."""
        b, nq = tokens.shape
        dev = tokens.device
        live = cache_lens >= 0
        steps = torch.arange(nq, device=dev, dtype=torch.int32)
        positions = (cache_lens.clamp_min(0)[:, None] + steps[None, :]).reshape(-1)        # [B * Q]
        rows = torch.where(live, torch.arange(b, device=dev, dtype=torch.int32), -1)
        rows = rows[:, None].expand(b, nq).reshape(-1).contiguous()                          # [B * Q]
        kv_lens = torch.where(live, cache_lens + nq, 0).to(torch.int32)                     # [B]
        hq, d = self.config.num_heads, self.config.head_dim

        def attend(q):                                                   # q [B * Q, Hq, D]
            o = multiquery_attention(q.view(b, nq, hq, d), kv_cache, block_table, kv_lens, splits=splits)
            return o.view(b * nq, hq * d)

        logits, h = self._layer(g, tokens.reshape(-1), positions, rows, kv_cache, block_table, error, attend)
        return logits.view(b, nq, -1), h.view(b, nq, -1)

    # ---- graph-capturable entry points -------------------------------------------------------
    def extend(self, hidden3: torch.Tensor, tokens: torch.Tensor, cache_lens: torch.Tensor, kv_cache,
               block_table: torch.Tensor, error: torch.Tensor, *, splits: int = 1):
        """Target-hidden path (and draft-extend after a verify).

        hidden3 [B, Q, 3H] (model dtype): the target's recorded hidden states at positions
        cache_lens[b] + j; tokens [B, Q] int64: the token after each of those positions (the
        shifted input; < 0 allowed in slots whose outputs are unused); cache_lens [B] int32:
        head K/V already cached per row (-1 = padding row: nothing written). Writes the Q
        positions' K/V into kv_cache (block_table [>= B, W] int32 rows; error [1] int32
        device_error). Returns draft logits [B, Q, Vd] and pre-norm h [B, Q, H]."""
        b, nq, _ = hidden3.shape
        g = linear(hidden3.reshape(b * nq, -1), self.weights.fc)                 # [B * Q, H]
        return self._rows(g, tokens, cache_lens, kv_cache, block_table, error, splits)

    def chain_step(self, h_prev: torch.Tensor, tokens: torch.Tensor, cache_lens: torch.Tensor, kv_cache,
                   block_table: torch.Tensor, error: torch.Tensor, *, splits: int = 1):
        """One draft step per row: h_prev [B, H] (the head's pre-norm h at the previous
        position), tokens [B] int64 (the previous draft token, target ids), at position
        cache_lens[b] (-1 = padding row); one K/V entry written per live row. Returns draft
        logits [B, Vd] and pre-norm h [B, H]."""
        logits, h = self._rows(h_prev, tokens[:, None], cache_lens, kv_cache, block_table, error, splits)
        return logits[:, 0], h[:, 0]

    # ---- eager ------------------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, hidden3: torch.Tensor, tokens: torch.Tensor, lens, kv_cache,
                block_table: torch.Tensor, error: torch.Tensor, *, chunk: int = PREFILL_CHUNK):
        """Eager: ragged prompts, prompt i on block-table row i. hidden3 [T, 3H] and tokens [T]
        (the token after each position: the prompt shifted by one, then the first sampled
        token) of all prompts, concatenated; lens: prompt lengths (host ints). Writes positions
        0 .. len - 1 of each row; returns the last position's draft logits [n, Vd] and
        pre-norm h [n, H]."""
        if sum(lens) != hidden3.shape[0] or tokens.shape != (hidden3.shape[0],):
            raise ValueError(f"lens: {list(lens)} sum to {sum(lens)}, hidden3 has {hidden3.shape[0]} rows "
                             f"and tokens {tuple(tokens.shape)}")
        logits, hs, start = [], [], 0
        for r, n in enumerate(lens):
            if n < 1:
                raise ValueError(f"lens[{r}]: every prompt needs >= 1 token, got {n}")
            pieces = prefill_chunks(n, chunk)
            firsts = tensor_on([s for s, _ in pieces], torch.int32, self.device)   # one copy a prompt
            for i, (s, q) in enumerate(pieces):
                lg, h = self.extend(hidden3[None, start + s: start + s + q], tokens[None, start + s: start + s + q],
                                    firsts[i:i + 1], kv_cache, block_table[r:r + 1], error)
            logits.append(lg[0, -1])
            hs.append(h[0, -1])
            start += n
        return torch.stack(logits), torch.stack(hs)

    @torch.no_grad()
    def warm_prefill(self, kv_cache, block_table: torch.Tensor, error: torch.Tensor, *,
                     chunk: int = PREFILL_CHUNK) -> None:
        """Run the prompt loop's kernels once at every tile size `prefill` can use
        (`prefill_tile_sizes(chunk)`) on a padding row (cache_lens -1: nothing written), so that
        each specialisation of the multi-query kernel (its query length is a compile-time
        constant) is compiled at start-up, and held by a graph cache, never while serving.
        block_table [>= 1, W] int32 (read only), error [1] int32 device_error."""
        h3 = self.weights.fc.shape[1]
        dev = self.device
        for q in prefill_tile_sizes(chunk):
            hidden = torch.zeros((1, q, h3), dtype=self.weights.dtype, device=dev)
            tokens = torch.zeros((1, q), dtype=torch.int64, device=dev)
            self.extend(hidden, tokens, torch.full((1,), -1, dtype=torch.int32, device=dev), kv_cache,
                        block_table[:1], error)


def prefill_tile_sizes(chunk: int = PREFILL_CHUNK) -> tuple[int, ...]:
    """The query lengths `prefill_chunks(n, chunk)` uses over every n: chunk and the powers of
    two below it, ascending (16 -> 1, 2, 4, 8, 16)."""
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk: must be an int >= 1, got {chunk!r}")
    return tuple(sorted({1 << i for i in range(chunk.bit_length()) if 1 << i < chunk} | {chunk}))


def prefill_chunks(n: int, chunk: int = PREFILL_CHUNK) -> list[tuple[int, int]]:
    """(start, length) pieces of an n-token prompt: `chunk`-token pieces, then the remainder in
    powers of two, largest first (13 -> 8, 4, 1), so the multi-query kernel, specialised on its
    query length, is compiled for chunk and the powers of two below it only, never per prompt.
    n >= 0 and chunk >= 1 (ints); ValueError naming the field otherwise."""
    for name, v, lo in (("n", n, 0), ("chunk", chunk, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name}: must be an int >= {lo}, got {v!r}")
    out, s = [], 0
    while n - s >= chunk:
        out.append((s, chunk))
        s += chunk
    q = 1 << max(n - s, 1).bit_length()
    while s < n:
        q >>= 1
        if n - s >= q:
            out.append((s, q))
            s += q
    return out


__all__ = ["Eagle3Head", "PREFILL_CHUNK", "prefill_chunks", "prefill_tile_sizes"]
