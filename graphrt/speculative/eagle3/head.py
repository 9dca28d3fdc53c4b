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

`extend` (the target-hidden path: the first draft after a prompt and draft-extend after a
verify), `chain_step` (one draft token per row, fed its own pre-norm h) and `write_kv` (the
prompt pass: a position's K/V needs only the layer's first half, up to the K/V append, and
only a prompt's last position has an output anyone reads) take fixed shapes, read lengths
only on the device and never sync the host: all three can be captured in a CUDA graph (the
prompt pass inside the target's prefill graphs: eagle3/prompt.py). `prefill_kv` / `prefill`
are the eager passes over ragged prompts, through the same code. Draft ids map to target ids
through `weights.draft_ids` (`to_target`).
"""
from __future__ import annotations

import torch

from graphrt.kernels.activation import silu_mul
from graphrt.kernels.decode_attention import decode_attention
from graphrt.kernels.multiquery_attention import multiquery_attention
from graphrt.kernels.norm import add_rms_norm, embed_rms_norm, rms_norm
from graphrt.kernels.query_layout import query_layout
from graphrt.kernels.rope_append import rope_append_prefill
from graphrt.kernels.transfer import tensor_on
from graphrt.model.linear import linear
from graphrt.model.rope import cos_sin_cache


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
    def _project(self, g, tokens, positions, rows, kv_cache, block_table, error):
        """The layer's first half: g [T, H], tokens [T] int64 (any stride; < 0: padding ids) ->
        (x [T, 2H], rotated q [T, Hq, D]); each token's K/V written at its position in its row's
        pages (rows [T] int32, -1 = padding: nothing written). A position's K/V needs nothing
        else: the prompt pass (`write_kv`) stops here."""
        w, c = self.weights, self.config
        eps, (t, h) = c.rms_norm_eps, g.shape
        x = torch.empty((t, 2 * h), dtype=g.dtype, device=g.device)
        embed_rms_norm(self.embed, tokens, w.input_norm, eps, out=x[:, :h])     # gathered as loaded
        rms_norm(g, w.hidden_norm, eps, out=x[:, h:])
        q = rope_append_prefill(linear(x, w.qkv), self.cos_sin, kv_cache, block_table, positions, rows,
                                error, num_q_heads=c.num_heads, eps=eps)        # [T, Hq, D]
        return x, q

    def _layer(self, g, tokens, positions, rows, kv_cache, block_table, error, attend, at=None):
        """g [T, H] (consumed: it becomes the residual stream, written in place), tokens [T]
        int64 -> (draft logits [T, Vd], pre-norm h [T, H]), model dtype; with at [B] int64 (rows
        of T), only those rows: ([B, Vd], [B, H]), the LM head run on B rows."""
        w, c = self.weights, self.config
        eps, h = c.rms_norm_eps, g.shape[1]
        x, q = self._project(g, tokens, positions, rows, kv_cache, block_table, error)
        # the residual stream in place: x is dead once qkv has read it, g once its norm has
        residual = x[:, h:] if c.norm_before_residual else g
        y = add_rms_norm(linear(attend(q), w.o), residual, w.post_attn_norm, eps)   # residual: g + attn
        out = add_rms_norm(linear(silu_mul(linear(y, w.gate_up)), w.down), residual, w.norm, eps)
        if at is not None:
            out, residual = out.index_select(0, at), residual.index_select(0, at)
        return linear(out, w.lm_head), residual                                  # residual: pre-norm h

    def _rows(self, g, tokens, cache_lens, kv_cache, block_table, error, splits, *, offset=0, at=None,
              scratch=None, one_query=False):
        """g [B * Q, H] (consumed), tokens [B, Q] at positions cache_lens[b] + offset + j (-1 =
        padding row) -> ([B, Q, Vd], [B, Q, H]); with at [B] int64 (rows of B * Q): ([B, Vd], [B, H]).
        Attention: the multi-query kernel (static `splits`), or with one_query (Q = 1) the decode
        kernel (MAX_SPLITS `splits`, `scratch`)."""
        b, nq = tokens.shape
        positions, rows, kv_lens = query_layout(cache_lens, nq, offset=offset)   # one launch
        hq, d = self.config.num_heads, self.config.head_dim

        def attend(q):                                                   # q [B * Q, Hq, D]
            if one_query:   # one launch, pipelined key loop, merge by the last split: no combine
                o = decode_attention(q.view(b, hq, d), kv_cache, block_table, kv_lens, max_splits=splits,
                                     scratch=scratch)
            else:
                o = multiquery_attention(q.view(b, nq, hq, d), kv_cache, block_table, kv_lens, splits=splits)
            return o.view(b * nq, hq * d)

        logits, h = self._layer(g, tokens.reshape(-1), positions, rows, kv_cache, block_table, error, attend, at)
        return (logits, h) if at is not None else (logits.view(b, nq, -1), h.view(b, nq, -1))

    # ---- graph-capturable entry points -------------------------------------------------------
    def extend(self, hidden3: torch.Tensor, tokens: torch.Tensor, cache_lens: torch.Tensor, kv_cache,
               block_table: torch.Tensor, error: torch.Tensor, *, splits: int = 1, at: torch.Tensor | None = None):
        """Target-hidden path (and draft-extend after a verify).

        hidden3 [B, Q, 3H] (model dtype): the target's recorded hidden states at positions
        cache_lens[b] + j; tokens [B, Q] int64: the token after each of those positions (the
        shifted input; < 0 allowed in slots whose outputs are unused); cache_lens [B] int32:
        head K/V already cached per row (-1 = padding row: nothing written). Writes the Q
        positions' K/V into kv_cache (block_table [>= B, W] int32 rows; error [1] int32
        device_error). Returns draft logits [B, Q, Vd] and pre-norm h [B, Q, H]; with at [B]
        int64 (row b * Q + j of each row's position to read), only those: [B, Vd] and [B, H] (the
        LM head over B rows, not B * Q)."""
        b, nq, _ = hidden3.shape
        if at is not None and (not isinstance(at, torch.Tensor) or tuple(at.shape) != (b,)
                               or at.dtype != torch.int64 or at.device != hidden3.device):
            got = f"{tuple(at.shape)} {at.dtype} on {at.device}" if isinstance(at, torch.Tensor) else repr(at)
            raise ValueError(f"at: expected a [{b}] int64 tensor on {hidden3.device} (rows of B * Q), got {got}")
        g = linear(hidden3.reshape(b * nq, -1), self.weights.fc)                 # [B * Q, H]
        return self._rows(g, tokens, cache_lens.to(torch.int32).contiguous(), kv_cache, block_table, error,
                          splits, at=at)

    def chain_step(self, h_prev: torch.Tensor, tokens: torch.Tensor, cache_lens: torch.Tensor, kv_cache,
                   block_table: torch.Tensor, error: torch.Tensor, *, splits: int = 1, offset: int = 0,
                   scratch=None):
        """One draft step per row: h_prev [B, H] (the head's pre-norm h at the previous
        position; consumed: the returned h is written over it), tokens [B] int64 (any stride:
        the previous draft token, target ids), at position cache_lens[b] + offset (cache_lens
        [B] int32, -1 = padding row; offset a host int); one K/V entry written per live row.
        One query per row: attention is the one-launch decode kernel (kernels/decode_attention.py),
        `splits` its MAX_SPLITS (> 1 needs `scratch`, a DecodeScratch for B rows; the drafter
        owns one). Returns draft logits [B, Vd] and pre-norm h [B, H]."""
        logits, h = self._rows(h_prev, tokens[:, None], cache_lens.to(torch.int32).contiguous(), kv_cache,
                               block_table, error, splits, offset=offset, scratch=scratch, one_query=True)
        return logits[:, 0], h[:, 0]

    def write_kv(self, hidden3: torch.Tensor, tokens: torch.Tensor, cache_lens: torch.Tensor, kv_cache,
                 block_table: torch.Tensor, error: torch.Tensor, *, q_lens: torch.Tensor | None = None) -> None:
        """The prompt pass: only the K/V of Q positions per row, no attention, MLP or LM head
        (a position's K/V is k/v_proj of its own x; only the last prompt position's output is
        ever used, and the first draft computes it). hidden3 [B, Q, 3H], tokens [B, Q] int64 and
        cache_lens [B] int32 as for `extend`; q_lens [B] int32 (device, optional): each row's
        real positions, the rest padding (no K/V written). Capturable."""
        b, nq, _ = hidden3.shape
        g = linear(hidden3.reshape(b * nq, -1), self.weights.fc)                 # [B * Q, H]
        positions, rows, _ = query_layout(cache_lens.to(torch.int32).contiguous(), nq,
                                          None if q_lens is None else q_lens.to(torch.int32).contiguous())
        self._project(g, tokens.reshape(-1), positions, rows, kv_cache, block_table, error)

    # ---- eager ------------------------------------------------------------------------------
    @torch.no_grad()
    def prefill_kv(self, hidden3: torch.Tensor, tokens: torch.Tensor, lens, kv_cache,
                   block_table: torch.Tensor, error: torch.Tensor, *, starts=None, whole=False) -> None:
        """Eager prompt pass over ragged prompts, prompt i on block-table row i from position
        starts[i] (default 0: earlier positions' K/V are already in its pages, a cached prefix or
        an earlier chunk): `write_kv` of its positions but the last (that one pairs with the first
        sampled token: `prefill`, or the drafter's first draft, writes it), or of every position
        with whole=True (a chunk whose next token is known). hidden3 [T, 3H] and tokens [T] (the
        token after each position: the prompt shifted by one, then the first sampled token or
        the chunk's next token) of all prompts, concatenated; lens: prompt lengths (host ints >= 1)."""
        check_ragged(hidden3, tokens, lens)
        starts = [0] * len(lens) if starts is None else [int(a) for a in starts]
        if len(starts) != len(lens) or min(starts, default=0) < 0:
            raise ValueError(f"starts: expected {len(lens)} ints >= 0, got {starts}")
        cache_lens = tensor_on(starts, torch.int32, self.device)             # [n], one host copy
        start = 0
        for r, n in enumerate(lens):
            m = n if whole else n - 1
            if m > 0:
                self.write_kv(hidden3[None, start: start + m], tokens[None, start: start + m], cache_lens[r:r + 1],
                              kv_cache, block_table[r:r + 1], error)
            start += n

    @torch.no_grad()
    def prefill(self, hidden3: torch.Tensor, tokens: torch.Tensor, lens, kv_cache,
                block_table: torch.Tensor, error: torch.Tensor, *, starts=None):
        """Eager: `prefill_kv`, then every prompt's last position (one `extend` over the n
        prompts, one position each). Writes positions start .. start + len - 1 of each row;
        returns the last positions' draft logits [n, Vd] and pre-norm h [n, H]."""
        self.prefill_kv(hidden3, tokens, lens, kv_cache, block_table, error, starts=starts)
        rows, at = last_positions(lens, self.device, starts)
        logits, h = self.extend(hidden3[rows, None], tokens[rows, None], at, kv_cache, block_table, error)
        return logits[:, 0], h[:, 0]

    @torch.no_grad()
    def warm_prefill(self, kv_cache, block_table: torch.Tensor, error: torch.Tensor) -> None:
        """Compile the eager prompt pass's kernels before serving: `write_kv` at WARM_TOKENS
        positions (Triton specialises an int argument, such as a kernel's token count, on
        whether it is 1 or a multiple of 16, and a pointer on its 16-byte alignment: these reach
        every variant, whatever the prompt length and its place in a batch) and `extend` at one position, on a padding row (cache_lens -1: nothing
        written). block_table [>= 1, W] int32 (read only), error [1] int32 device_error."""
        h3, dev = self.weights.fc.shape[1], self.device
        pad = torch.full((1,), -1, dtype=torch.int32, device=dev)
        for q in WARM_TOKENS:
            hidden = torch.zeros((1, q, h3), dtype=self.weights.dtype, device=dev)
            tokens = torch.zeros((1, q + 1), dtype=torch.int64, device=dev)
            for ids in (tokens[:, :q], tokens[:, 1:]):     # a prompt's tokens 16-byte aligned or not
                self.write_kv(hidden, ids, pad, kv_cache, block_table[:1], error)   # (a later prompt's slice)
        self.extend(hidden[:, :1], tokens[:, :1], pad, kv_cache, block_table[:1], error)


WARM_TOKENS = (1, 16, 17)   # a token count of each specialisation class: 1, multiples of 16, others


def check_ragged(hidden3: torch.Tensor, tokens: torch.Tensor, lens) -> None:
    """hidden3 [T, 3H] and tokens [T] of prompts of `lens` (host ints >= 1) concatenated."""
    for r, n in enumerate(lens):
        if n < 1:
            raise ValueError(f"lens[{r}]: every prompt needs >= 1 token, got {n!r}")
    if sum(lens) != hidden3.shape[0] or tokens.shape != (hidden3.shape[0],):
        raise ValueError(f"lens: {list(lens)} sum to {sum(lens)}, hidden3 has {hidden3.shape[0]} rows "
                         f"and tokens {tuple(tokens.shape)}")


def last_positions(lens, device, starts=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each prompt's last position of ragged prompts of `lens` (host ints) starting at `starts`
    (host ints, default 0) -> (its row in the concatenation [n] int64, the position start + len
    - 1 [n] int32), on `device` (one host copy)."""
    starts = [0] * len(lens) if starts is None else starts
    ends, at = [], 0
    for n in lens:
        at += n
        ends.append(at - 1)
    both = tensor_on([ends, [int(a) + n - 1 for a, n in zip(starts, lens)]], torch.int64, device)   # [2, n]
    return both[0], both[1].to(torch.int32)


__all__ = ["Eagle3Head", "WARM_TOKENS", "check_ragged", "last_positions"]
