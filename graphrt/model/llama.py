"""A Llama-family decoder (Llama 3.x, Qwen2/2.5, Qwen3) that decodes through graphrt's AttentionContext.

Weights are the fused layout of `weights.py` (one qkv GEMM with the Qwen2 biases, one gate_up
GEMM per layer). Decode, verify and prefill run one layer loop (`_layers`); per layer it is exactly:

    add+RMSNorm -> qkv GEMM -> rope_append (q/k norm, RoPE, k/v into the paged cache)
    -> attention -> o GEMM -> add+RMSNorm -> gate_up GEMM -> silu_mul -> down GEMM

(the first layer's input norm is a plain RMSNorm of the embeddings; the last add+RMSNorm uses
the final norm), then the LM head in the model dtype: `decode_step` returns [B, V] logits in the
model dtype, never a float32 copy. `decode_step` is a pure tensor function of the context and
the tokens, so it can be captured in a CUDA graph per bucket. RoPE reads one [max_positions, D]
float32 cos/sin table built here at load (`rope.py`).

FP8 weights (per-tensor / per-channel, `graphrt.model.quant.Fp8Weight`) run W8A8: the kernel
that produces a GEMM's input writes it as e4m3 rows with one scale per row (RMSNorm, SiLU-mul;
one quantize kernel for the attention output), the GEMM is cuBLASLt's FP8 kernel with unit
scales, and the row x channel scales are applied by the kernel that reads its output
(rope_append, add+RMSNorm, SiLU-mul; the logits by one scale kernel). Block-scaled FP8 weights
read model-dtype activations (`linear`: the FP8 GEMV dequantizing in registers).

Split-K (model/splitk.py): `decode_step(..., splitk=(S_o, S_down))` runs the o and down GEMMs
as one GEMM of split-K views each (S x the output tiles, the same weight bytes); the add+RMSNorm
that reads them sums the S partials as it loads. ModelRuntime chooses S per decode bucket
before capture; verify and prefill run S = 1.

Decode, verify and prefill can record residual-stream states for an EAGLE-3 head (`record=` layer
ids, `hidden_out=` a persistent [rows, len(record) * H] buffer: the RMSNorm kernel that stores a
recorded residual state stores it there too; off by
default, and then the loop is the same ops).

`prefill` runs eagerly: the same GEMMs and kernels over all prompts' tokens at once (rope_append
in prefill mode writes the paged cache), with attention per prompt in float32 torch over the
K/V read back from the pages. It is the stand-in for a batch-prefill kernel.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from graphrt.kernels.fp8_rows import Fp8Rows, ScaledAcc, padded_rows
from graphrt.kernels.ops import KernelOps, kernel_ops, resolve_kernels
from graphrt.kernels.transfer import tensor_on, to_device
from graphrt.model.linear import fp8_matmul, linear
from graphrt.model.quant.fp8 import Fp8Weight
from graphrt.model.quant.kv import calibrate_layer
from graphrt.model.rope import cos_sin_cache
from graphrt.model.splitk import split_matmul, splittable
from graphrt.model.spec import LlamaSpec, shard_spec
from graphrt.model.weights import LayerWeights, ModelWeights, fuse_hf_state_dict


def _quantize_rows(x: torch.Tensor) -> Fp8Rows:
    """kernels/fp8.py's quantize_rows (Triton: only W8A8 weights reach it, and they run the Triton
    kernel set; imported here so a model on the torch set imports no Triton)."""
    from graphrt.kernels.fp8 import quantize_rows
    return quantize_rows(x)


class LlamaDecoder:
    """Fused weights on one device in one dtype, plus the RoPE table; no autograd.

    weights: ModelWeights (checked against spec); max_positions: rows of the cos/sin table
    (default spec.max_position_embeddings); decoding needs max_context_len <= max_positions.
    tp: a `graphrt.parallel.TensorParallel` (world_size > 1): `weights` are then this rank's
    shard (`graphrt.parallel.shard`, geometry from `spec.shard_spec`), o / down outputs are all-reduced,
    the embedding is vocab-parallel and the LM head's vocab slices are all-gathered, so
    decode_step returns the full [B, V] logits on every rank. `spec` stays the whole model's.
    kernels: the per-layer kernels' implementation (kernels/ops.py), fixed here: "triton", "torch"
    (the kernels' torch references), or None / "auto": torch on a CPU, triton on CUDA, and triton
    wherever a weight is W8A8 FP8 (the torch set reads no FP8 activations; "torch" there is a
    ValueError). `self.ops` is the chosen set, `self.kernels` its name. "Capturable" below is the
    Triton set's property: the torch set runs eagerly (its multi-query attention reads the rows'
    lengths on the host).
    """

    def __init__(self, spec: LlamaSpec, weights: ModelWeights, *, max_positions: int | None = None,
                 tp=None, kernels: str | None = None):
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
        self._unit = torch.ones((), dtype=torch.float32, device=weights.device)  # FP8 GEMM scales
        self.kernels = self._resolve_kernels(kernels)
        self.ops: KernelOps = kernel_ops(self.kernels)

    def _resolve_kernels(self, kernels) -> str:
        w = self.weights
        w8a8 = any(self._fp8_in(x) for layer in w.layers for x in (layer.qkv, layer.o, layer.gate_up, layer.down)) \
            or self._fp8_in(w.lm_head)
        name = resolve_kernels(kernels, w.device)
        if name == "torch" and w8a8:
            if kernels == "torch":
                raise ValueError("kernels: 'torch' runs no FP8 activations, and this model has W8A8 FP8 "
                                 "weights; use 'triton' (or leave kernels out)")
            return "triton"
        return name

    @classmethod
    def from_state_dict(cls, spec: LlamaSpec, state_dict: dict, *, dtype=torch.float32, device="cpu",
                        max_positions: int | None = None, kernels: str | None = None) -> "LlamaDecoder":
        """From HF-named weights (see weights.fuse_hf_state_dict)."""
        return cls(spec, fuse_hf_state_dict(spec, state_dict, dtype, device), max_positions=max_positions,
                   kernels=kernels)

    @classmethod
    def from_hf(cls, hf_model, *, dtype=torch.float32, device="cpu",
                max_positions: int | None = None, kernels: str | None = None) -> "LlamaDecoder":
        """From a transformers LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM."""
        return cls.from_state_dict(LlamaSpec.from_hf(hf_model.config), hf_model.state_dict(),
                                   dtype=dtype, device=device, max_positions=max_positions, kernels=kernels)

    # ---- pieces shared by decode, verify and prefill -----------------------------------------
    def _next_norm(self, i: int) -> torch.Tensor:
        layers = self.weights.layers
        return layers[i + 1].input_norm if i + 1 < len(layers) else self.weights.final_norm

    @staticmethod
    def _fp8_in(w) -> bool:
        """Does the GEMM of weight w read row-quantized FP8 activations (W8A8)? Per-tensor /
        per-channel FP8 weights do; block-scaled ones and float weights read the model dtype."""
        return isinstance(w, Fp8Weight) and w.block is None

    def _mm(self, x, w, bias: torch.Tensor | None = None, *, split: int = 1):
        """x [T, K] (a tensor, or Fp8Rows when _fp8_in(w)) @ w.T (+ bias) -> [T, N]: a tensor,
        or a ScaledAcc whose scales (and bias) the consuming kernel applies; split S > 1 (no
        bias): a SplitAcc of S partial sums (model/splitk.py), read by add+RMSNorm only."""
        if split != 1:
            if bias is not None:
                raise ValueError("split: a split-K GEMM takes no bias")
            return split_matmul(x, w, split, unit=self._unit, out_dtype=self.dtype)
        if isinstance(x, Fp8Rows):
            return fp8_matmul(x, w, bias, unit=self._unit, out_dtype=self.dtype)
        return linear(x, w, bias)

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [T] int64 -> [T, H] embeddings (a copy)."""
        w = self.weights
        return w.embed[tokens] if self.tp is None else self.tp.embed(w.embed, tokens)

    def _reduce(self, x):
        """Sum of the ranks' partial o / down outputs (identity without TP). Under TP a ScaledAcc
        is scaled first: each rank's activation rows carry their own scales."""
        if self.tp is None:
            return x
        if isinstance(x, ScaledAcc):                                 # W8A8: the Triton set's FP8 kernels
            from graphrt.kernels.fp8 import apply_scales
            x = apply_scales(x)
        return self.tp.all_reduce(x)

    def _logits(self, h) -> torch.Tensor:
        """h [T, H] final-normed (a tensor, or Fp8Rows for a W8A8 LM head) -> [T, V] logits in
        the model dtype (every rank: all of V)."""
        head = self.weights.lm_head
        if self._fp8_in(head) and not isinstance(h, Fp8Rows):
            h = _quantize_rows(h)                                    # prefill's last rows
        local = self._mm(h, head)
        if isinstance(local, ScaledAcc):
            from graphrt.kernels.fp8 import apply_scales
            local = apply_scales(local)
        return local if self.tp is None else self.tp.gather_logits(local, self.spec.vocab_size)

    def _qk_norm_args(self, layer: LayerWeights) -> dict:
        return dict(num_q_heads=self.local_spec.num_heads, q_norm=layer.q_norm, k_norm=layer.k_norm,
                    eps=self.spec.rms_norm_eps)

    def _layers(self, tokens: torch.Tensor, rope, attend, *, fp8_head: bool, record=(), hidden_out=None,
                splitk: tuple[int, int] = (1, 1)):
        """The one layer loop of decode, verify and prefill. tokens [T] int64 -> final-normed
        hidden states [T, H] (Fp8Rows when fp8_head and the LM head is W8A8). rope(i, qkv, layer)
        -> q [T, Hq, D] (writes the layer's K/V); attend(i, q) -> [T, Hq * D] (model dtype).
        Per layer: GEMM qkv -> rope_append -> attention -> GEMM o -> add+RMSNorm -> GEMM gate_up
        -> SiLU-mul -> GEMM down -> add+RMSNorm; with W8A8 weights the norms and SiLU-mul write
        FP8 rows, the attention output is quantized by one kernel, and each GEMM's scales are
        applied by its consumer (rope_append, add+RMSNorm, SiLU-mul).
        record / hidden_out: see `check_record` (the norm kernel that stores a recorded state
        writes it into hidden_out too; none when off).
        splitk: (S_o, S_down), the split-K factors of the o and down GEMMs (1: unsplit)."""
        w, eps, fp8, ops = self.weights, self.spec.rms_norm_eps, self._fp8_in, self.ops
        split_o, split_down = splitk
        layers = w.layers
        width = self.spec.hidden_size
        rec = {i: hidden_out[:, r * width:(r + 1) * width] for r, i in enumerate(record)}   # id -> its columns
        if self.tp is not None:
            residual = self._embed(tokens)                           # [T, H] (a copy)
            h = ops.rms_norm(residual, layers[0].input_norm, eps, fp8=fp8(layers[0].qkv))
        else:                                # the gather, the residual's start and its norm: one launch
            residual = torch.empty((tokens.shape[0], width), dtype=w.embed.dtype, device=w.embed.device)
            h = ops.embed_rms_norm(w.embed, tokens, layers[0].input_norm, eps, fp8=fp8(layers[0].qkv),
                               residual=residual, copy_to=rec.pop(0, None))
        for i, layer in enumerate(layers):
            if i in rec and i == 0:                                  # the stream entering layer 0
                rec[i].copy_(residual)                               # (else the norm kernel stored it)
            qkv = self._mm(h, layer.qkv, layer.qkv_bias)            # (this rank's heads)
            a = attend(i, rope(i, qkv, layer))                       # [T, Hq * D]
            o = self._reduce(self._mm(_quantize_rows(a) if fp8(layer.o) else a, layer.o, split=split_o))
            h = ops.add_rms_norm(o, residual, layer.post_attn_norm, eps, fp8=fp8(layer.gate_up))
            m = ops.silu_mul(self._mm(h, layer.gate_up), fp8=fp8(layer.down))
            nxt = layers[i + 1].qkv if i + 1 < len(layers) else (w.lm_head if fp8_head else None)
            h = ops.add_rms_norm(self._reduce(self._mm(m, layer.down, split=split_down)), residual,
                             self._next_norm(i), eps, fp8=fp8(nxt), copy_to=rec.get(i + 1))
        return h

    def check_record(self, record, hidden_out, rows: int) -> tuple[int, ...]:
        """record: ascending distinct ids in [0, L] of residual-stream states to copy out (id
        i < L: the stream entering decoder layer i, 0 = the embeddings; id L: after the last
        layer, before the final norm), () = off (no op added); hidden_out: [rows, len(record) *
        H] in the model dtype on the weights' device, column block r = id record[r]. Checked on
        the host from shapes only (no sync: capturable)."""
        record = tuple(record)
        if not record:
            if hidden_out is not None:
                raise ValueError("hidden_out: given without record ids")
            return record
        L, hsz = self.spec.num_layers, self.spec.hidden_size
        if any(isinstance(i, bool) or not isinstance(i, int) for i in record) \
                or list(record) != sorted(set(record)) or record[0] < 0 or record[-1] > L:
            raise ValueError(f"record: expected distinct ascending ints in [0, {L}], got {list(record)}")
        want = (rows, len(record) * hsz)
        if not isinstance(hidden_out, torch.Tensor) or tuple(hidden_out.shape) != want \
                or hidden_out.dtype != self.dtype or hidden_out.device != self.weights.device:
            got = None if not isinstance(hidden_out, torch.Tensor) else \
                f"{list(hidden_out.shape)} {hidden_out.dtype} on {hidden_out.device}"
            raise ValueError(f"hidden_out: expected {list(want)} {self.dtype} on {self.weights.device}, got {got}")
        return record

    # ---- decode (graph-capturable) ------------------------------------------------------------
    def decode_step(self, ctx, tokens: torch.Tensor, *, record=(), hidden_out=None,
                    splitk: tuple[int, int] = (1, 1)) -> torch.Tensor:
        """tokens [B] int64 (device) -> logits [B, vocab] in the model dtype.

        ctx.prepare() must have run. Writes each row's K/V at slot seq_len - 1 of every layer.
        record / hidden_out [B, len(record) * H]: residual-stream states copied out (`check_record`).
        splitk: (S_o, S_down) split-K factors of the o and down GEMMs (model/splitk.py; each
        weight must be `splittable`; (1, 1) under tensor parallelism)."""
        b = tokens.shape[0]
        record = self.check_record(record, hidden_out, b)
        self._check_splitk(splitk)

        view = ctx.view

        def rope(i, qkv, layer):                                     # as ctx.rope_append, this model's kernels
            cache = ctx.kv_caches[i]
            return self.ops.rope_append_decode(qkv, self.cos_sin, cache, view.block_table, view.seq_lens,
                                               view.device_error, kv_scale=cache.scale,
                                               **self._qk_norm_args(layer))
        h = self._layers(tokens, rope, lambda i, q: ctx.attention(i, q).view(b, -1), fp8_head=True,
                         record=record, hidden_out=hidden_out, splitk=splitk)
        return self._logits(h)

    def _check_splitk(self, splitk) -> None:
        """ValueError unless splitk is (S_o, S_down) that every layer's o and down can run (host
        check of shapes only)."""
        ok = isinstance(splitk, tuple) and len(splitk) == 2 and all(
            not isinstance(s, bool) and isinstance(s, int) and s >= 1 for s in splitk)
        if ok and splitk != (1, 1):
            if self.kernels != "triton":
                raise ValueError(f"splitk: {splitk!r} needs the Triton kernels (add+RMSNorm sums the split "
                                 f"partials); this model runs kernels={self.kernels!r}")
            ok = self.tp is None and all(splittable(layer.o, splitk[0]) and splittable(layer.down, splitk[1])
                                         for layer in self.weights.layers)
        if not ok:
            o, down = self.weights.layers[0].o, self.weights.layers[0].down
            raise ValueError(f"splitk: expected (S_o, S_down) ints >= 1 that split K={o.shape[1]} (o) and "
                             f"K={down.shape[1]} (down) into multiples of 16 (tensor parallel: (1, 1)), "
                             f"got {splitk!r}")

    # ---- verify and prefill chunks (graph-capturable): Q tokens per request ------------------
    def verify_step(self, tokens: torch.Tensor, cache_lens: torch.Tensor, kv_caches, block_table: torch.Tensor,
                    error: torch.Tensor, *, splits: int = 1, record=(), hidden_out=None,
                    offset: int = 0) -> torch.Tensor:
        """tokens [B, Q] int64 (device; rows may be strided): row b's current token then its
        proposals, at positions cache_lens[b] + offset + j; cache_lens [B] int32: K/V already in
        the cache, less the host int `offset` (-1 = padding row: no K/V written, its logits are
        garbage; a draft model's steps read one base tensor at growing offsets). Returns [B * Q,
        vocab] logits in the model dtype; row (b, j) predicts the token after tokens[b, j].

        The decode step's layer loop and kernels (`_layers`): writes the Q tokens' K/V at
        positions cache_lens .. cache_lens + Q - 1 of every layer (rope_append_prefill), then
        attends causally with the plan-free multi-query kernel (kernels/multiquery_attention.py;
        `splits`: its static split-KV factor). block_table [>= B, W] int32 must hold pages for
        them; error: [1] int32 device_error of the K/V append. record / hidden_out [B * Q,
        len(record) * H] (row b * Q + j): residual-stream states copied out (`check_record`).
        No host sync, fixed shapes: capturable per bucket."""
        b, nq = tokens.shape
        record = self.check_record(record, hidden_out, b * nq)
        return self._logits(self._multiquery(tokens, cache_lens, None, kv_caches, block_table, error,
                                             splits=splits, fp8_head=True, record=record,
                                             hidden_out=hidden_out, offset=offset))

    def prefill_step(self, tokens: torch.Tensor, cache_lens: torch.Tensor, q_lens: torch.Tensor, kv_caches,
                     block_table: torch.Tensor, error: torch.Tensor, *, splits: int = 1, record=(),
                     hidden_out=None, block_n: int | None = None) -> torch.Tensor:
        """A prefill chunk of B rows in a graph of fixed shape: tokens [B, Q] int64 (device), row
        b's q_lens[b] <= Q real tokens first (the rest padding: any valid ids), at positions
        cache_lens[b] + j (positions [0, cache_lens[b]) already in the cache and only read);
        cache_lens / q_lens [B] int32 (device; cache_lens -1 = an unused row). Returns [B, vocab]
        logits (model dtype) of each row's last real token. The verify step's kernels and loop:
        the real tokens' K/V are written (padding writes none), attention is the multi-query
        kernel in query tiles; the LM head runs on B rows only. record / hidden_out [B * Q,
        len(record) * H]: residual-stream states of every token (`check_record`). No host sync:
        capturable."""
        b, nq = tokens.shape
        record = self.check_record(record, hidden_out, b * nq)
        h = self._multiquery(tokens, cache_lens, q_lens, kv_caches, block_table, error, splits=splits,
                             fp8_head=False, record=record, hidden_out=hidden_out,
                             block_n=block_n)                # rows gathered below
        last = torch.arange(b, device=tokens.device) * nq + (q_lens.long() - 1).clamp_min(0)   # [B]
        return self._logits(h.index_select(0, last))

    def mixed_step(self, ctx, tokens: torch.Tensor, chunk_tokens: torch.Tensor, positions: torch.Tensor,
                   rows: torch.Tensor, table: torch.Tensor, kv_lens: torch.Tensor, q_lens: torch.Tensor,
                   kv_caches, block_table: torch.Tensor, error: torch.Tensor, *, splits: int = 1,
                   block_n: int | None = None) -> torch.Tensor:
        """A decode step that also prefills a prompt chunk (model/mixed.py). tokens [B] int64: the
        decode rows (ctx prepared for them); chunk_tokens [C] int64: q_lens[0] <= C real tokens
        first; positions / rows [B + C] int32: each token's position and row of block_table
        (the slot table; -1: padding, no K/V written); table [1, W] int32: the chunk slot's
        pages; kv_lens [1] int32: its keys including the chunk's (0: no chunk); error: [1] int32
        sticky flag of the K/V append. One layer loop over B + C rows (`_layers`), one
        rope_append launch for all of them, the decode rows' attention with the step's plan, the
        chunk's with the multi-query kernel (`splits`, `block_n`) -> [B, vocab] logits of the
        decode rows (model dtype). No host sync: capturable."""
        b, c = tokens.shape[0], chunk_tokens.shape[0]
        hq, d = self.local_spec.num_heads, self.local_spec.head_dim

        def attend(i, q):                                            # q [B + C, Hq, D]
            out = torch.empty_like(q)
            ctx.attention(i, q[:b], out=out[:b])
            self.ops.multiquery_attention(q[b:].view(1, c, hq, d), kv_caches[i], table, kv_lens, q_lens=q_lens,
                                          splits=splits, block_n=block_n, out=out[b:].view(1, c, hq, d))
            return out.view(b + c, hq * d)

        h = self._layers(torch.cat([tokens, chunk_tokens]),
                         self._prefill_rope(positions, rows, kv_caches, block_table, error), attend,
                         fp8_head=True)                      # the decode rows' head as decode_step's
        h = Fp8Rows(h.data[:padded_rows(b)], h.scale[:b]) if isinstance(h, Fp8Rows) else h[:b]
        return self._logits(h)

    def _multiquery(self, tokens, cache_lens, q_lens, kv_caches, block_table, error, *, splits: int,
                    fp8_head: bool, record=(), hidden_out=None, block_n: int | None = None, offset: int = 0):
        """The layer loop over tokens [B, Q] at positions cache_lens + offset + j (live rows) ->
        final-normed hidden states [B * Q, H] (Fp8Rows with fp8_head and a W8A8 LM head); q_lens
        None: every token real, else [B] int32 real tokens per row."""
        b, nq = tokens.shape
        positions, rows, kv_lens = self.ops.query_layout(            # [B * Q], [B * Q] (-1: padding), [B]
            cache_lens.to(torch.int32).contiguous(), nq,
            None if q_lens is None else q_lens.to(torch.int32).contiguous(), offset=offset)
        hq, d = self.local_spec.num_heads, self.local_spec.head_dim

        def attend(i, q):                                            # q [B * Q, Hq, D]
            o = self.ops.multiquery_attention(q.view(b, nq, hq, d), kv_caches[i], block_table, kv_lens,
                                              q_lens=q_lens, splits=splits, block_n=block_n)
            return o.view(b * nq, hq * d)

        return self._layers(tokens.reshape(-1), self._prefill_rope(positions, rows, kv_caches, block_table,
                                                                   error), attend, fp8_head=fp8_head,
                            record=record, hidden_out=hidden_out)

    def _prefill_rope(self, positions, rows, kv_caches, block_table, error, *, calibrate_kv: bool = False):
        """rope(i, qkv, layer) for tokens at explicit positions [T] of block-table rows [T].
        FP8 caches: k / v stored as x / cache.scale; calibrate_kv sets each layer's scale from
        these tokens first (graphrt/model/quant/kv.py)."""
        def rope(i, qkv, layer):
            cache = kv_caches[i]
            if calibrate_kv and cache.fp8:
                s = self.local_spec
                calibrate_layer(cache.scale, qkv, num_q_heads=s.num_heads, num_kv_heads=s.num_kv_heads,
                                head_dim=s.head_dim, k_norm=layer.k_norm, eps=self.spec.rms_norm_eps)
            return self.ops.rope_append_prefill(qkv, self.cos_sin, cache, block_table, positions, rows,
                                       error, **self._qk_norm_args(layer), kv_scale=cache.scale)
        return rope

    # ---- prefill (eager) ----------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, prompts: list[torch.Tensor], kv_caches, block_table: torch.Tensor, *,
                attention=None, max_tokens: int | None = None, on_logits=None,
                logits_rows=frozenset(), calibrate_kv: bool = False, record=(),
                hidden_out=None, starts=None, host_table: torch.Tensor | None = None) -> torch.Tensor:
        """Causal forward over the prompts, K/V written into the paged caches (eager).

        prompts: list of [T_i] int64 token tensors, prompt i on row i of block_table ([n, w]
        int32, on the weights' device); returns [n, vocab] float32 logits of each last token.
        attention: a `graphrt.model.prefill.PrefillAttention` (FlashInfer batch prefill on CUDA, its
        float32 paged reference on CPU); the prompts then run in chunks of at most `max_tokens`
        tokens (default: all at once), ragged prompts together, so activation memory is bounded.
        Without it: one pass, float32 torch attention per prompt (model-only use and tests).
        on_logits(i, start, logits [n, V] float32): called for every prompt i in logits_rows with
        the logits of its positions start .. start + n - 1, chunk by chunk (prompt log-probs).
        calibrate_kv: FP8 caches take their k / v scales from this prefill's (first chunk's) tokens.
        record / hidden_out [sum(T_i), len(record) * H]: residual-stream states of every prompt
        token, prompts concatenated in order (`check_record`).
        starts: ints >= 0, the position of each prompt's first token (default 0): positions
        [0, start) are already in its pages (a cached prefix, an earlier chunk) and are read, not
        written; needs `attention`.
        host_table: block_table's contents on the host (the checks and the attention plans read
        it there; default: read back from block_table, a host sync on a GPU).
        """
        starts = [0] * len(prompts) if starts is None else [int(x) for x in starts]
        if len(starts) != len(prompts) or any(x < 0 for x in starts):
            raise ValueError(f"starts: expected {len(prompts)} ints >= 0, got {starts}")
        if attention is None and any(starts):
            raise ValueError("starts: a prefill after cached tokens needs `attention` (PrefillAttention)")
        if host_table is not None and (not isinstance(host_table, torch.Tensor) or host_table.device.type != "cpu"
                                       or host_table.shape != block_table.shape
                                       or host_table.dtype != block_table.dtype):
            raise ValueError(f"host_table: expected block_table's {tuple(block_table.shape)} {block_table.dtype} "
                             f"on the CPU, got {getattr(host_table, 'shape', host_table)!r} "
                             f"{getattr(host_table, 'dtype', '')} {getattr(host_table, 'device', '')}")
        table = host_table if host_table is not None else block_table.cpu()   # checks and plans read it
        lens = self.check_prompts(prompts, kv_caches, block_table, starts, table)
        record = self.check_record(record, hidden_out, sum(lens))
        dev = self.weights.device
        prompts = [to_device(p, dev) for p in prompts]
        error = torch.zeros(1, dtype=torch.int32, device=dev)
        if attention is None:
            positions = torch.cat([torch.arange(n, dtype=torch.int32) for n in lens]).to(dev)
            rows = torch.cat([torch.full((n,), r, dtype=torch.int32) for r, n in enumerate(lens)]).to(dev)
            h = self._forward_tokens(torch.cat(prompts), positions, rows, kv_caches, block_table, error,
                                     lambda i, q: self._prompt_attention(q, kv_caches[i], block_table, lens),
                                     calibrate_kv=calibrate_kv, record=record, hidden_out=hidden_out)
            last = torch.tensor(lens, device=dev).cumsum(0) - 1
            logits = self._logits(h[last]).float()
            for i in sorted(logits_rows):
                on_logits(i, 0, self._logits(h[int(last[i]) + 1 - lens[i]: int(last[i]) + 1]).float())
        else:
            from graphrt.model.prefill import plan_chunks
            logits = torch.empty((len(lens), self.spec.vocab_size), dtype=torch.float32, device=dev)
            offsets = [0] + torch.tensor(lens).cumsum(0).tolist()
            for n_chunk, chunk in enumerate(plan_chunks(lens, max_tokens=max_tokens or sum(lens), cached=starts)):
                meta = attention.plan(chunk, table)
                tokens = torch.cat([prompts[i][s - starts[i]: s - starts[i] + n] for i, s, n in
                                    zip(chunk.seqs, chunk.starts, chunk.lens)])
                part = None if not record else hidden_out.new_empty((tokens.numel(), hidden_out.shape[1]))
                h = self._forward_tokens(
                    tokens, meta.positions, meta.rows, kv_caches, block_table, error,
                    lambda i, q: attention.run(q, kv_caches[i]).view(q.shape[0], -1),
                    calibrate_kv=calibrate_kv and n_chunk == 0, record=record, hidden_out=part)
                if record:                                  # the chunk's rows at their prompt offsets
                    at = torch.cat([torch.arange(offsets[i] + s - starts[i], offsets[i] + s - starts[i] + n) for i, s, n in
                                    zip(chunk.seqs, chunk.starts, chunk.lens)])
                    hidden_out.index_copy_(0, to_device(at, dev), part)
                ends = torch.tensor(chunk.lens).cumsum(0) - 1
                for j, (i, s, n) in enumerate(zip(chunk.seqs, chunk.starts, chunk.lens)):
                    if i in logits_rows:
                        on_logits(i, s, self._logits(h[int(ends[j]) + 1 - n: int(ends[j]) + 1]).float())
                done = [j for j, (i, s, n) in enumerate(zip(chunk.seqs, chunk.starts, chunk.lens))
                        if s + n == starts[i] + lens[i]]
                if done:
                    idx = tensor_on([chunk.seqs[j] for j in done], torch.long, dev)
                    logits[idx] = self._logits(h[to_device(ends[done], dev)]).float()
        if int(error.item()):
            raise RuntimeError(f"prefill: K/V append flagged device_error {int(error.item())}")
        return logits

    def _forward_tokens(self, tokens, positions, rows, kv_caches, block_table, error, attend, *,
                        calibrate_kv: bool = False, record=(), hidden_out=None):
        """tokens [T] int64 at positions [T] of block-table rows [T] (int32) -> final-normed
        hidden states [T, H] (model dtype); each layer's K/V written by rope_append_prefill;
        attend(layer, q) maps q [T, Hq, D] to [T, Hq * D]."""
        return self._layers(tokens, self._prefill_rope(positions, rows, kv_caches, block_table, error,
                                                       calibrate_kv=calibrate_kv),
                            attend, fp8_head=False, record=record, hidden_out=hidden_out)

    def check_prompts(self, prompts, kv_caches, block_table, starts, table) -> list[int]:
        """Host checks of a prefill: prompts n [T >= 1] int64, block_table [>= n, w] int32 (shape
        only), table its host copy: positions within max_positions and the table, page ids in
        the pool -> the prompts' lengths. ValueError naming the prompt or table otherwise."""
        if len(kv_caches) != self.spec.num_layers:
            raise ValueError(f"kv_caches: {len(kv_caches)} caches, model has {self.spec.num_layers} layers")
        if block_table.dim() != 2 or block_table.dtype != torch.int32 or len(prompts) > block_table.shape[0]:
            raise ValueError(f"block_table: expected [>= {len(prompts)}, w] int32, got "
                             f"{tuple(block_table.shape)} {block_table.dtype}")
        kc = kv_caches[0].k
        page = kc.shape[1] if kv_caches[0].layout == "NHD" else kc.shape[2]
        lens = []
        for r, p in enumerate(prompts):
            if p.dim() != 1 or p.dtype != torch.int64 or p.numel() < 1:
                raise ValueError(f"prompts[{r}]: expected [T >= 1] int64, got {tuple(p.shape)} {p.dtype}")
            n = p.numel()
            if starts[r] + n > min(self.max_positions, table.shape[1] * page):
                raise ValueError(f"prompts[{r}]: {n} tokens from position {starts[r]}, beyond max_positions="
                                 f"{self.max_positions} or the block table's {table.shape[1]} pages of {page}")
            used = table[r, : -(-(starts[r] + n) // page)]
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
            k_scale, v_scale = cache.kv_scales()                     # FP8 pages: dequantized
            qf = q[start:start + n].transpose(0, 1).float()
            kf = k.repeat_interleave(rep, 1).transpose(0, 1).float() * k_scale
            vf = v.repeat_interleave(rep, 1).transpose(0, 1).float() * v_scale
            o = F.scaled_dot_product_attention(qf, kf, vf, is_causal=True)
            out.append(o.transpose(0, 1).reshape(n, -1).to(q.dtype))
            start += n
        return torch.cat(out)


__all__ = ["LlamaDecoder", "LlamaSpec"]
