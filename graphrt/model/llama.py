"""A Llama-family decoder (Llama 3.x, Qwen2/2.5, Qwen3) that decodes through graphrt's AttentionContext.

Weights are the fused layout of `weights.py` (one qkv GEMM with the Qwen2 biases, one gate_up
GEMM per layer). One decode step per layer is exactly:

    add+RMSNorm -> qkv GEMM -> rope_append (q/k norm, RoPE, k/v into the paged cache)
    -> attention -> o GEMM -> add+RMSNorm -> gate_up GEMM -> silu_mul -> down GEMM

(the first layer's input norm is a plain RMSNorm of the embeddings; the last add+RMSNorm uses
the final norm), then the LM head in the model dtype: `decode_step` returns [B, V] logits in the
model dtype, never a float32 copy. `decode_step` is a pure tensor function of the context and
the tokens, so it can be captured in a CUDA graph per bucket. RoPE reads one [max_positions, D]
float32 cos/sin table built here at load (`rope.py`).

`prefill` runs eagerly: the same GEMMs and kernels over all prompts' tokens at once (rope_append
in prefill mode writes the paged cache), with attention per prompt in float32 torch over the
K/V read back from the pages. It is the stand-in for a batch-prefill kernel.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from graphrt.kernels.activation import silu_mul
from graphrt.kernels.norm import add_rms_norm, rms_norm
from graphrt.kernels.rope_append import rope_append_prefill
from graphrt.model.linear import linear
from graphrt.model.rope import cos_sin_cache
from graphrt.model.spec import LlamaSpec, shard_spec
from graphrt.model.weights import LayerWeights, ModelWeights, fuse_hf_state_dict


class LlamaDecoder:
    """Fused weights on one device in one dtype, plus the RoPE table; no autograd.

    weights: ModelWeights (checked against spec); max_positions: rows of the cos/sin table
    (default spec.max_position_embeddings); decoding needs max_context_len <= max_positions.
    tp: a `graphrt.parallel.TensorParallel` (world_size > 1): `weights` are then this rank's
    shard (`graphrt.parallel.shard`, geometry from `spec.shard_spec`), o / down outputs are all-reduced,
    the embedding is vocab-parallel and the LM head's vocab slices are all-gathered, so
    decode_step returns the full [B, V] logits on every rank. `spec` stays the whole model's.
    """

    def __init__(self, spec: LlamaSpec, weights: ModelWeights, *, max_positions: int | None = None,
                 tp=None):
        self.tp = tp if tp is not None and tp.world_size > 1 else None   # None: no collectives
        if self.tp is None:
            self.local_spec = spec
        else:
            self.local_spec = shard_spec(spec, tp.world_size)
        weights.check(self.local_spec)
        self.spec, self.weights = spec, weights
        self.dtype = weights.dtype
        self.max_positions = spec.max_position_embeddings if max_positions is None else max_positions
        self.cos_sin = cos_sin_cache(spec, self.max_positions, weights.device)  # [P, D] float32

    @classmethod
    def from_state_dict(cls, spec: LlamaSpec, state_dict: dict, *, dtype=torch.float32, device="cpu",
                        max_positions: int | None = None) -> "LlamaDecoder":
        """From HF-named weights (see weights.fuse_hf_state_dict)."""
        return cls(spec, fuse_hf_state_dict(spec, state_dict, dtype, device), max_positions=max_positions)

    @classmethod
    def from_hf(cls, hf_model, *, dtype=torch.float32, device="cpu",
                max_positions: int | None = None) -> "LlamaDecoder":
        """From a transformers LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM."""
        return cls.from_state_dict(LlamaSpec.from_hf(hf_model.config), hf_model.state_dict(),
                                   dtype=dtype, device=device, max_positions=max_positions)

    # ---- pieces shared by decode and prefill --------------------------------------------------
    def _next_norm(self, i: int) -> torch.Tensor:
        layers = self.weights.layers
        return layers[i + 1].input_norm if i + 1 < len(layers) else self.weights.final_norm

    def _mlp(self, layer: LayerWeights, h: torch.Tensor) -> torch.Tensor:
        """h [T, H] normed -> [T, H]: down(silu(gate) * up), one gate_up GEMM."""
        return self._reduce(linear(silu_mul(linear(h, layer.gate_up)), layer.down))

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [T] int64 -> [T, H] embeddings (a copy)."""
        w = self.weights
        return w.embed[tokens] if self.tp is None else self.tp.embed(w.embed, tokens)

    def _reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of the ranks' partial o / down outputs (identity without TP)."""
        return x if self.tp is None else self.tp.all_reduce(x)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """h [T, H] final-normed -> [T, V] logits in the model dtype (every rank: all of V)."""
        local = linear(h, self.weights.lm_head)
        return local if self.tp is None else self.tp.gather_logits(local, self.spec.vocab_size)

    def _qk_norm_args(self, layer: LayerWeights) -> dict:
        return dict(num_q_heads=self.local_spec.num_heads, q_norm=layer.q_norm, k_norm=layer.k_norm,
                    eps=self.spec.rms_norm_eps)

    # ---- decode (graph-capturable) ------------------------------------------------------------
    def decode_step(self, ctx, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B] int64 (device) -> logits [B, vocab] in the model dtype.

        ctx.prepare() must have run. Writes each row's K/V at slot seq_len - 1 of every layer."""
        w, eps, b = self.weights, self.spec.rms_norm_eps, tokens.shape[0]
        residual = self._embed(tokens)                               # [B, H] (a copy)
        h = rms_norm(residual, w.layers[0].input_norm, eps)
        for i, layer in enumerate(w.layers):
            qkv = linear(h, layer.qkv, layer.qkv_bias)             # [B, (Hq + 2Hkv) D] (rank's heads)
            q = ctx.rope_append(i, qkv, self.cos_sin, **self._qk_norm_args(layer))
            o = ctx.attention(i, q)                                  # [B, Hq, D]
            attn = self._reduce(linear(o.view(b, -1), layer.o))    # [B, H]
            h = add_rms_norm(attn, residual, layer.post_attn_norm, eps)
            h = add_rms_norm(self._mlp(layer, h), residual, self._next_norm(i), eps)
        return self._logits(h)

    # ---- verify (graph-capturable): Q tokens per request, speculative decoding -----------------
    def verify_step(self, tokens: torch.Tensor, cache_lens: torch.Tensor, kv_caches, block_table: torch.Tensor,
                    error: torch.Tensor, *, splits: int = 1) -> torch.Tensor:
        """tokens [B, Q] int64 (device): row b's current token then its proposals, at positions
        cache_lens[b] + j; cache_lens [B] int32: K/V already in the cache (-1 = padding row: no
        K/V written, its logits are garbage). Returns [B * Q, vocab] logits in the model dtype;
        row (b, j) predicts the token after tokens[b, j].

        Writes the Q tokens' K/V at positions cache_lens .. cache_lens + Q - 1 of every layer
        (rope_append_prefill), then attends causally with the plan-free multi-query kernel
        (kernels/multiquery_attention.py; `splits`: its static split-KV factor). block_table
        [>= B, W] int32 must hold pages for them; error: [1] int32 device_error of the K/V
        append. No host sync, fixed shapes: capturable per bucket."""
        from graphrt.kernels.multiquery_attention import multiquery_attention
        b, nq = tokens.shape
        live = cache_lens >= 0
        steps = torch.arange(nq, device=tokens.device, dtype=torch.int32)
        positions = (cache_lens.clamp_min(0)[:, None] + steps[None, :]).reshape(-1)        # [B * Q]
        rows = torch.where(live, torch.arange(b, device=tokens.device, dtype=torch.int32), -1)
        rows = rows[:, None].expand(b, nq).reshape(-1).contiguous()                           # [B * Q]
        kv_lens = torch.where(live, cache_lens + nq, 0).to(torch.int32)                      # [B]
        hq, d = self.local_spec.num_heads, self.local_spec.head_dim

        def attend(i, q):                                            # q [B * Q, Hq, D]
            o = multiquery_attention(q.view(b, nq, hq, d), kv_caches[i], block_table, kv_lens,
                                     splits=splits)
            return o.view(b * nq, hq * d)

        h = self._forward_tokens(tokens.reshape(-1), positions, rows, kv_caches, block_table, error,
                                 attend)
        return self._logits(h)

    # ---- prefill (eager) ----------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, prompts: list[torch.Tensor], kv_caches, block_table: torch.Tensor, *,
                attention=None, max_tokens: int | None = None) -> torch.Tensor:
        """Causal forward over the prompts, K/V written into the paged caches (eager).

        prompts: list of [T_i] int64 token tensors, prompt i on row i of block_table ([n, w]
        int32, on the weights' device); returns [n, vocab] float32 logits of each last token.
        attention: a `graphrt.model.prefill.PrefillAttention` (FlashInfer batch prefill on CUDA, its
        float32 paged reference on CPU); the prompts then run in chunks of at most `max_tokens`
        tokens (default: all at once), ragged prompts together, so activation memory is bounded.
        Without it: one pass, float32 torch attention per prompt (model-only use and tests).
        """
        lens = self._check_prefill(prompts, kv_caches, block_table)
        dev = self.weights.device
        prompts = [p.to(dev) for p in prompts]
        error = torch.zeros(1, dtype=torch.int32, device=dev)
        if attention is None:
            positions = torch.cat([torch.arange(n, dtype=torch.int32) for n in lens]).to(dev)
            rows = torch.cat([torch.full((n,), r, dtype=torch.int32) for r, n in enumerate(lens)]).to(dev)
            h = self._forward_tokens(torch.cat(prompts), positions, rows, kv_caches, block_table, error,
                                     lambda i, q: self._prompt_attention(q, kv_caches[i], block_table, lens))
            last = torch.tensor(lens, device=dev).cumsum(0) - 1
            logits = self._logits(h[last]).float()
        else:
            from graphrt.model.prefill import plan_chunks
            logits = torch.empty((len(lens), self.spec.vocab_size), dtype=torch.float32, device=dev)
            for chunk in plan_chunks(lens, max_tokens=max_tokens or sum(lens)):
                meta = attention.plan(chunk, block_table)
                tokens = torch.cat([prompts[i][s: s + n] for i, s, n in
                                    zip(chunk.seqs, chunk.starts, chunk.lens)])
                h = self._forward_tokens(
                    tokens, meta.positions, meta.rows, kv_caches, block_table, error,
                    lambda i, q: attention.run(q, kv_caches[i]).view(q.shape[0], -1))
                ends = torch.tensor(chunk.lens).cumsum(0) - 1
                done = [j for j, (i, s, n) in enumerate(zip(chunk.seqs, chunk.starts, chunk.lens))
                        if s + n == lens[i]]
                if done:
                    idx = torch.tensor([chunk.seqs[j] for j in done], device=dev)
                    logits[idx] = self._logits(h[ends[done].to(dev)]).float()
        if int(error.item()):
            raise RuntimeError(f"prefill: K/V append flagged device_error {int(error.item())}")
        return logits

    def _forward_tokens(self, tokens, positions, rows, kv_caches, block_table, error, attend):
        """tokens [T] int64 at positions [T] of block-table rows [T] (int32) -> final-normed
        hidden states [T, H]; each layer's K/V written by rope_append_prefill; attend(layer, q)
        maps q [T, Hq, D] to [T, Hq * D]."""
        w, eps = self.weights, self.spec.rms_norm_eps
        residual = self._embed(tokens)                               # [T, H]
        h = rms_norm(residual, w.layers[0].input_norm, eps)
        for i, layer in enumerate(w.layers):
            qkv = linear(h, layer.qkv, layer.qkv_bias)
            q = rope_append_prefill(qkv, self.cos_sin, kv_caches[i], block_table, positions, rows,
                                    error, **self._qk_norm_args(layer))
            h = add_rms_norm(self._reduce(linear(attend(i, q), layer.o)), residual,
                             layer.post_attn_norm, eps)
            h = add_rms_norm(self._mlp(layer, h), residual, self._next_norm(i), eps)
        return h

    def _check_prefill(self, prompts, kv_caches, block_table) -> list[int]:
        if len(kv_caches) != self.spec.num_layers:
            raise ValueError(f"kv_caches: {len(kv_caches)} caches, model has {self.spec.num_layers} layers")
        if block_table.dim() != 2 or block_table.dtype != torch.int32 or len(prompts) > block_table.shape[0]:
            raise ValueError(f"block_table: expected [>= {len(prompts)}, w] int32, got "
                             f"{tuple(block_table.shape)} {block_table.dtype}")
        kc = kv_caches[0].k
        page = kc.shape[1] if kv_caches[0].layout == "NHD" else kc.shape[2]
        table = block_table.cpu()
        lens = []
        for r, p in enumerate(prompts):
            if p.dim() != 1 or p.dtype != torch.int64 or p.numel() < 1:
                raise ValueError(f"prompts[{r}]: expected [T >= 1] int64, got {tuple(p.shape)} {p.dtype}")
            n = p.numel()
            if n > min(self.max_positions, table.shape[1] * page):
                raise ValueError(f"prompts[{r}]: {n} tokens, beyond max_positions={self.max_positions} "
                                 f"or the block table's {table.shape[1]} pages of {page}")
            used = table[r, : -(-n // page)]
            if int(used.min()) < 0 or int(used.max()) >= kc.shape[0]:
                raise ValueError(f"block_table: row {r} uses page ids outside [0, {kc.shape[0]})")
            lens.append(n)
        return lens

    def _prompt_attention(self, q, cache, block_table, lens) -> torch.Tensor:
        """q [T, Hq, D] of all prompts -> [T, Hq * D]: causal attention per prompt in float32
        over the K/V read back from its pages."""
        s = self.spec
        kc, vc = cache.as_tuple()
        page = kc.shape[1] if cache.layout == "NHD" else kc.shape[2]
        rep = s.num_heads // s.num_kv_heads
        out, start = [], 0
        for r, n in enumerate(lens):
            pos = torch.arange(n, device=q.device)
            pages, slots = block_table[r].long()[pos // page], pos % page
            k, v = (kc[pages, slots], vc[pages, slots]) if cache.layout == "NHD" else \
                   (kc[pages, :, slots], vc[pages, :, slots])        # [n, Hkv, D]
            qf = q[start:start + n].transpose(0, 1).float()
            kf = k.repeat_interleave(rep, 1).transpose(0, 1).float()
            vf = v.repeat_interleave(rep, 1).transpose(0, 1).float()
            o = F.scaled_dot_product_attention(qf, kf, vf, is_causal=True)
            out.append(o.transpose(0, 1).reshape(n, -1).to(q.dtype))
            start += n
        return torch.cat(out)


__all__ = ["LlamaDecoder", "LlamaSpec"]
