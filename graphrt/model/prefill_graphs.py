"""Graphed prefill: a prompt (or a piece of one) as one CUDA-graph replay per token bucket.

An eager prefill pays the host for every op of every layer plus FlashInfer's host plan (on the
H200, ~8 ms of host per prompt for a 2-layer model, more than its device time), which is the
floor under every TTFT and stalls the decode streams while it runs. Here the model's prefill
chunk (`LlamaDecoder.prefill_step`: the verify step's layer loop, plan-free multi-query
attention in query tiles, the LM head on the last real token) is captured once per token
bucket T (16, 32, ... up to `max_tokens`) for one request, padded to T:

    pg = PrefillGraphs(model, config, device, max_tokens=512)
    pg.capture(graphs, kv_caches)                           # with the decode graphs, one pool
    logits = pg.prefill(graphs, prompts, host_table, starts, kv_caches)   # [n, V] float32

A prompt of n new tokens (after `starts[i]` cached ones) runs as pieces of at most max_tokens,
in order, each padded to the smallest bucket that holds it; the last piece's logits are the
prompt's. Per piece the host copies the tokens on the device and one pinned block of ints
(the cached length, the real tokens, the prompt's block-table row) and replays: no per-layer
host work, no plan. One host sync per call: the K/V append's device error flag.

Inputs live in `PrefillBuffers` (one typed object, the graphs read it in place). On a device
without graphs (CPU) the same step runs eagerly through the graph runner (tests).
`record_states(layer_ids)` (before capture; an EAGLE-3 head's target) makes every prefill graph
also record those residual-stream states of the piece's tokens (LlamaDecoder's `record=`) into
`buf.hidden`, copied out to the caller's hidden_out (every token) or hidden_last (each prompt's
last token) after each replay. `add_stage(stage, caches=)` (before capture) appends a second
model's pass over the piece to every bucket's graph, after the target's layers: `stage(t, buf)`
reads the buffers in place (an EAGLE-3 head's prompt pass: speculative/eagle3/prompt.py), so a
piece stays one replay. This module knows nothing of what a stage computes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from graphrt.attention.buckets import pick_bucket
from graphrt.attention.graphs import GraphKey, GraphRunner
from graphrt.kernels.mq_launch import piece_launch
from graphrt.kernels.transfer import copy_into

MIN_BUCKET = 16
# A prefill call of more new tokens than this runs eagerly (FlashInfer's batch prefill): its host
# cost hides behind its device time, and there FlashInfer's attention is faster (H200, Llama-3.2-1B
# shape, 4128 new tokens: 40.9 ms through the graphs vs 27.7 ms eager; a 32-token piece after
# 4096 cached ones: 8.2 ms vs 19.0; the multi-query kernel is 1.1-2.5x FlashInfer's attention,
# tools/bench_prefill_attention.py).
EAGER_ABOVE_TOKENS = 2048


def prefill_token_buckets(max_tokens: int) -> tuple[int, ...]:
    """Token buckets of the graphed prefill: powers of two from 16 below max_tokens, then
    max_tokens itself (an int >= 1); ascending."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens: must be an int >= 1, got {max_tokens!r}")
    out, t = [], MIN_BUCKET
    while t < max_tokens:
        out.append(t)
        t *= 2
    return tuple(out) + (max_tokens,)


def reachable_buckets(buckets: tuple[int, ...], most_tokens: int) -> tuple[int, ...]:
    """The buckets a piece of at most `most_tokens` tokens can pick (pick_bucket: the smallest
    that holds it): those up to the first >= most_tokens; the larger ones are never replayed, so
    they are not captured (pure; buckets ascending)."""
    for i, t in enumerate(buckets):
        if t >= most_tokens:
            return buckets[: i + 1]
    return buckets


def plan_pieces(lens, starts, max_tokens: int) -> list[tuple[int, int, int]]:
    """(prompt i, first position, tokens) of every replay, prompt by prompt, each prompt's
    pieces in position order and at most max_tokens long (pure; lens >= 1, starts >= 0)."""
    out = []
    for i, (n, s) in enumerate(zip(lens, starts)):
        for a in range(0, n, max_tokens):
            out.append((i, s + a, min(max_tokens, n - a)))
    return out


@dataclass
class PrefillBuffers:
    """What the prefill graphs read and write, on the runtime device.
    tokens [T_max + 1] int64: the piece's ids, then the prompt's next token where it has one
    (a stage pairing position t with token t + 1 reads tokens[1 : T + 1]), then padding (stale
    valid ids);
    ints [2 + W] int32: cache_len (tokens already in the cache), q_len (real tokens), then the
    prompt's block-table row of W pages (one host-to-device copy per piece);
    logits [1, V] float32: the last real token's; error [1] int32: the K/V append's flag;
    hidden [T_max, len(record) * H] model dtype, or None: recorded states (record_states)."""

    tokens: torch.Tensor
    ints: torch.Tensor
    logits: torch.Tensor
    error: torch.Tensor
    hidden: torch.Tensor | None = None

    @classmethod
    def allocate(cls, max_tokens: int, pages_per_seq: int, vocab: int, device) -> "PrefillBuffers":
        z = lambda *shape, dtype: torch.zeros(shape, dtype=dtype, device=device)  # noqa: E731
        return cls(z(max_tokens + 1, dtype=torch.int64), z(2 + pages_per_seq, dtype=torch.int32),
                   z(1, vocab, dtype=torch.float32), z(1, dtype=torch.int32))

    cache_len = property(lambda self: self.ints[0:1])                  # [1] int32
    q_len = property(lambda self: self.ints[1:2])                      # [1] int32
    table = property(lambda self: self.ints[2:].view(1, -1))           # [1, W] int32


class PrefillGraphs:
    """The graphed prefill of one model runtime: buckets, buffers, per-bucket split-KV factor;
    capture and replay go through the runtime's GraphRunner (GraphKey(phase, 1, query_len=T));
    phase: "prefill" for the target, another name for a second model in the same runner (a
    draft model's "draft_prefill")."""

    def __init__(self, model, config, device, *, max_tokens: int, phase: str = "prefill"):
        self.model, self.config, self.device, self.phase = model, config, torch.device(device), phase
        # a prompt holds at most max_context_len tokens (checked before every prefill)
        self.buckets = reachable_buckets(prefill_token_buckets(max_tokens), config.max_context_len)
        self.max_tokens = max_tokens
        self.buf = PrefillBuffers.allocate(max_tokens, config.max_pages_per_seq, model.spec.vocab_size,
                                           self.device)
        heads = getattr(model, "local_spec", model.spec)
        group = heads.num_heads // heads.num_kv_heads
        # a short piece after a long cached prefix is one tile per KV head: split its keys
        # (splits, block_n) per bucket: kernels/multiquery_attention.py piece_launch (128 keys a step
        # from 64 query tokens up: H200, a 512-token piece after 4096 cached, 1B shape 171 vs 226 us,
        # 8B shape 296 vs 426 us; H100, 64 and 128 tokens at 0-4k cached: faster at both shapes; 64
        # below: 32 tokens 92 vs 120 us)
        self.launch = {t: piece_launch(self.device, t, group, heads.num_kv_heads, config.max_context_len)
                       for t in self.buckets}
        self.record: tuple[int, ...] = ()            # residual-stream ids recorded (record_states)
        self.stage = None                             # add_stage's pass, run in every graph
        self._stage_caches: list = []                 # the KV caches it writes (capture scratch)
        self._captured = False

    def record_states(self, layer_ids) -> None:
        """Every prefill graph also records these residual-stream ids (LlamaDecoder's `record`)
        of its tokens; call before capture()."""
        ids = tuple(layer_ids)
        self.model.check_record(ids, None if not ids else torch.empty(
            (1, len(ids) * self.model.spec.hidden_size), dtype=self.model.dtype, device=self.device), 1)
        self.record = ids
        self.buf.hidden = torch.zeros((self.max_tokens, len(ids) * self.model.spec.hidden_size),
                                      dtype=self.model.dtype, device=self.device) if ids else None

    def add_stage(self, stage, *, caches=()) -> None:
        """stage(t, buf): a pass over each piece run after the target's layers inside every
        bucket's graph (t: the bucket; buf: these PrefillBuffers, read in place: tokens,
        cache_len / q_len (padding tokens must write nothing), table, hidden, error). Fixed
        shapes and no host sync (it is captured); caches: the KV caches it writes (kept intact
        by the capture). One stage; call before capture()."""
        if self._captured or self.stage is not None:
            raise RuntimeError("add_stage: one stage, added before capture()")
        if not callable(stage):
            raise TypeError(f"stage: expected a callable (t, buf), got {type(stage).__name__}")
        self.stage, self._stage_caches = stage, list(caches)

    def key(self, tokens: int) -> GraphKey:
        return GraphKey(self.phase, 1, query_len=tokens)

    def _step(self, t: int, kv_caches) -> None:
        b = self.buf
        rec = {"record": self.record, "hidden_out": b.hidden[:t]} if self.record else {}
        logits = self.model.prefill_step(b.tokens[:t].view(1, t), b.cache_len, b.q_len, kv_caches, b.table,
                                         b.error, splits=self.launch[t][0], block_n=self.launch[t][1], **rec)
        b.logits.copy_(logits)
        if self.stage is not None:
            self.stage(t, b)

    def capture(self, graphs: GraphRunner, kv_caches) -> None:
        """Capture every bucket not yet captured, largest first (warm-up and capture run a piece of
        0 real tokens: nothing is written)."""
        self._captured = True
        for t in reversed(self.buckets):
            if self.key(t) not in graphs:
                graphs.capture(self.key(t), lambda t=t: self._step(t, kv_caches),
                               inputs=[(self.buf.ints, 0), (self.buf.tokens, 0)],
                               scratch=list(kv_caches) + self._stage_caches)

    def prefill(self, graphs: GraphRunner, prompts: list[torch.Tensor], host_table: torch.Tensor, starts,
                kv_caches, *, hidden_out: torch.Tensor | None = None,
                hidden_last: torch.Tensor | None = None, error_into: torch.Tensor | None = None,
                after=None) -> torch.Tensor:
        """prompts: n [T_i] int64 on the device (checked by the caller), prompt i on row i of
        host_table ([n, W] int32, CPU) from position starts[i] -> [n, V] float32 logits of each
        prompt's last token. after: n host ints or None, the token that follows each prompt
        where it is known (a chunk of a longer context): a stage pairing position t with token
        t + 1 reads it at the last position (else a stale token there). hidden_out [sum T_i, len(record) * H] (with record_states): each
        token's recorded states, prompts concatenated in order; hidden_last [>= n, len(record) *
        H]: row i gets prompt i's last token's (device copies, no sync). Raises RuntimeError if
        the K/V append (the target's or the stage's) flagged bad pages (one host sync); with
        error_into (an int32 device flag, the runtime's sticky device_error) the flags are OR-ed
        into it on the device instead, no sync: its owner reads it later."""
        for name, t in (("hidden_out", hidden_out), ("hidden_last", hidden_last)):
            if t is not None and not self.record:
                raise ValueError(f"{name}: these prefill graphs record nothing (record_states)")
        width = (len(prompts), self.buf.hidden.shape[1]) if self.record else None
        if hidden_last is not None and (hidden_last.dim() != 2 or hidden_last.shape[0] < width[0]
                                        or hidden_last.shape[1] != width[1]):
            raise ValueError(f"hidden_last: expected [>= {width[0]}, {width[1]}], got {tuple(hidden_last.shape)}")
        b, dev = self.buf, self.device
        out = torch.empty((len(prompts), b.logits.shape[1]), dtype=torch.float32, device=dev)
        b.error.zero_()
        lens = [p.numel() for p in prompts]
        offsets = [0]
        for n in lens:
            offsets.append(offsets[-1] + n)
        ints = torch.zeros(b.ints.shape, dtype=torch.int32)                 # host, staged per piece
        w = host_table.shape[1]
        if w > ints.numel() - 2:
            raise ValueError(f"host_table: {w} pages a row, beyond max_pages_per_seq={ints.numel() - 2}")
        for i, s, n in plan_pieces(lens, starts, self.max_tokens):
            t = pick_bucket(self.buckets, n)
            a = s - starts[i]
            m = min(n + 1, lens[i] - a)                                   # + the next token, if any
            b.tokens[:m].copy_(prompts[i][a: a + m])
            if m == n and after is not None and after[i] is not None:
                b.tokens[n].fill_(int(after[i]))                          # the token after a chunk
            ints[0], ints[1] = s, n
            ints[2:2 + w].copy_(host_table[i])
            copy_into(b.ints, ints)
            graphs.run(self.key(t), lambda t=t: self._step(t, kv_caches))
            if hidden_out is not None:
                hidden_out[offsets[i] + a: offsets[i] + a + n].copy_(b.hidden[:n])
            if a + n == lens[i]:
                out[i].copy_(b.logits[0])
                if hidden_last is not None:
                    hidden_last[i].copy_(b.hidden[n - 1])
        if error_into is not None:
            error_into.bitwise_or_(b.error)
        elif int(b.error.item()):
            raise RuntimeError(f"prefill: K/V append flagged device_error {int(b.error.item())}")
        return out


__all__ = ["PrefillGraphs", "PrefillBuffers", "prefill_token_buckets", "reachable_buckets", "plan_pieces",
           "EAGER_ABOVE_TOKENS"]
