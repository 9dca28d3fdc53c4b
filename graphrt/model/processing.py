"""Per-slot logits processing on the device: penalties, logit bias, banned tokens, min_tokens, min_p.

The state (`ProcessState`, part of the slots: model/slots.py `SlotState.proc`) is read and
advanced by the processed decode graphs in place; the host writes a slot's rows once, when its
request is prefilled (`write_rows`), from a host-built `ProcessRows`.

Token counts: a dense [B, V] int32 count of the tokens each slot has drawn (presence and
frequency penalties: OpenAI's rule over output tokens) and a [B, V] bool mask of its prompt
tokens (the repetition penalty: HF's rule over prompt + output tokens). At 8B shapes (V = 128k)
that is 0.6 MB per slot: cheap next to one page of KV, and it makes every rule one dense
elementwise pass with no per-step host work. A drawn token is counted on the device right after
it is drawn (`count`), so K steps of a block see each other's tokens.

Token rules: up to L (id, value, until) entries per slot, value added to the logit while the
slot's draw index < until (id -1: no entry). One table serves logit_bias (until = FOREVER),
bad words (value -inf) and min_tokens (-inf on stop / end-of-sequence ids, until = min_tokens).

Order per draw (`process`): repetition penalty, presence / frequency penalties, token rules; then
(sampled rows only) min_p at the row's temperature: tokens with p < min_p * p_max become -inf.
The sampler (kernels/sample.py) then applies temperature, top-k and top-p to the result.
The rule runs fused in a few chunked passes (kernels/logits_process.py; its float32 torch
statement, kernels/reference_sample.py, is the tests' reference and the torch kernel set's: each
call takes the model's kernel set, `ops`); a decode step whose rows use no top-k / top-p (`draw`)
also draws, records log-probabilities and counts the token in the same passes.

Speculative verification (`process_verify`, called by speculative/runner.py's processed rounds
before `accept.judge`) gives the target distribution of each verified position after the same
processing, the proposals before it counted as drawn and the draw index step + j; the round then
counts the tokens it emitted. So acceptance draws from exactly what plain decoding would.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from graphrt.kernels.ops import KernelOps, default_ops
from graphrt.kernels.transfer import to_device

PRESENCE, FREQUENCY, REPETITION, MIN_P = range(4)      # rows of `params`
NUM_PARAMS = 4
NEUTRAL = (0.0, 0.0, 1.0, 0.0)                         # the parameters of an unprocessed row
FOREVER = 2**31 - 1                                    # `until` of a rule that never expires
RULE_WIDTH = 160                                       # token rules per slot (L)


@dataclass(frozen=True)
class ProcessRows:
    """Host-built rows for m slots being prefilled (CPU tensors).

    params [m, NUM_PARAMS] float32; rule_ids [m, L] int64 (-1 = none); rule_vals [m, L] float32;
    rule_until [m, L] int32; prompt [P] int64 and output [Q] int64: flat indices row * V + token of
    each row's prompt tokens and of the output tokens it already drew (after a preemption;
    repeats count)."""

    params: torch.Tensor
    rule_ids: torch.Tensor
    rule_vals: torch.Tensor
    rule_until: torch.Tensor
    prompt: torch.Tensor
    output: torch.Tensor

    @classmethod
    def build(cls, rows: list[dict], vocab: int, width: int = RULE_WIDTH) -> "ProcessRows":
        """rows: per slot {"params": 4 floats, "rules": [(id, value, until)], "prompt": ids,
        "output": ids}. ValueError when a row has more than `width` rules."""
        m = len(rows)
        ids = torch.full((m, width), -1, dtype=torch.int64)
        vals = torch.zeros((m, width), dtype=torch.float32)
        until = torch.zeros((m, width), dtype=torch.int32)
        for r, row in enumerate(rows):
            rules = row["rules"]
            if len(rules) > width:
                raise ValueError(f"logit_bias, bad_words, min_tokens: {len(rules)} token rules, at most {width}")
            if rules:
                ids[r, :len(rules)] = torch.tensor([x[0] for x in rules])
                vals[r, :len(rules)] = torch.tensor([x[1] for x in rules], dtype=torch.float32)
                until[r, :len(rules)] = torch.tensor([x[2] for x in rules], dtype=torch.int32)
        flat = lambda key: torch.tensor([r * vocab + t for r, row in enumerate(rows) for t in row[key]],
                                        dtype=torch.int64)
        return cls(torch.tensor([row["params"] for row in rows], dtype=torch.float32).reshape(m, NUM_PARAMS),
                   ids, vals, until, flat("prompt"), flat("output"))


@dataclass(frozen=True)
class ProcessState:
    """Device rows of B slots (the runtime's device): counts [B, V] int32 (tokens drawn),
    prompt [B, V] bool (prompt tokens), params [NUM_PARAMS, B] float32, rule_ids [B, L] int64,
    rule_vals [B, L] float32, rule_until [B, L] int32; bias [B, V] float32, all zero between
    calls: the kernels' scratch for the token rules (None: a zero one allocated per call)."""

    counts: torch.Tensor
    prompt: torch.Tensor
    params: torch.Tensor
    rule_ids: torch.Tensor
    rule_vals: torch.Tensor
    rule_until: torch.Tensor
    bias: torch.Tensor | None = None

    @classmethod
    def allocate(cls, max_batch: int, vocab: int, device, *, width: int = RULE_WIDTH) -> "ProcessState":
        b = max_batch
        params = torch.tensor(NEUTRAL, dtype=torch.float32, device=device)[:, None].repeat(1, b)
        return cls(torch.zeros((b, vocab), dtype=torch.int32, device=device),
                   torch.zeros((b, vocab), dtype=torch.bool, device=device), params,
                   torch.full((b, width), -1, dtype=torch.int64, device=device),
                   torch.zeros((b, width), dtype=torch.float32, device=device),
                   torch.zeros((b, width), dtype=torch.int32, device=device),
                   torch.zeros((b, vocab), dtype=torch.float32, device=device))

    @property
    def vocab(self) -> int:
        return self.counts.shape[1]

    def write_rows(self, slots: torch.Tensor, rows: ProcessRows) -> None:
        """Reset slots [m] int64 (device) to `rows` (host -> device copies, stream-ordered,
        through pinned memory: no host sync, kernels/transfer.py)."""
        dev, v = self.counts.device, self.vocab
        rows_dev = to_device(slots, dev)
        self.counts.index_fill_(0, rows_dev, 0)
        self.prompt.index_fill_(0, rows_dev, False)
        self.params.index_copy_(1, rows_dev, to_device(rows.params, dev).t().contiguous())
        self.rule_ids.index_copy_(0, rows_dev, to_device(rows.rule_ids, dev))
        self.rule_vals.index_copy_(0, rows_dev, to_device(rows.rule_vals, dev))
        self.rule_until.index_copy_(0, rows_dev, to_device(rows.rule_until, dev))
        for flat, target in ((rows.prompt, self.prompt), (rows.output, self.counts)):
            if flat.numel():
                flat = to_device(flat, dev)
                at = rows_dev[flat // v] * v + flat % v                  # row-in-m -> slot
                if target.dtype == torch.bool:                           # (t[at] = True copies the
                    target.view(-1).index_fill_(0, at, True)             # scalar with a sync)
                else:
                    target.view(-1).index_add_(0, at, torch.ones_like(at, dtype=target.dtype))

    def _bias(self, rows: int) -> torch.Tensor:
        if self.bias is not None:
            return self.bias
        return torch.zeros((rows, self.vocab), dtype=torch.float32, device=self.counts.device)

    def process(self, logits: torch.Tensor, sel, step: torch.Tensor,
                temperature: torch.Tensor, *, ops: KernelOps | None = None) -> torch.Tensor:
        """logits [b, V] (any float dtype) of slots `sel` (an int b: slots [0, b); or a [b] int64
        index tensor) -> [b, V] float32 processed logits. step [b] int32 (each row's draw index),
        temperature [b] float32 (0 = greedy: min_p not applied). ops: the kernel set (kernels/ops.py;
        None: Triton's), as for `draw` and `process_verify`. Capturable."""
        slots = None if isinstance(sel, int) else sel.to(self.counts.device)
        return default_ops(ops).process_logits(logits, self.counts, self.prompt, self.params, self.rule_ids, self.rule_vals,
                              self.rule_until, self._bias(self.counts.shape[0]), step, temperature, slots=slots)

    def draw(self, logits: torch.Tensor, size: int, seed: torch.Tensor, step: torch.Tensor,
             temperature: torch.Tensor, live: torch.Tensor, out: torch.Tensor, logprob_rows, *,
             source: str, ops: KernelOps | None = None) -> torch.Tensor:
        """One processed decode step of slots [0, size) with no top-k / top-p row, fused
        (kernels/logits_process.py): process logits [size, V] (model dtype), draw into out
        [size] int64 (kernels/sample.py's rule; step [size] int32 += 1), record log-probabilities
        into logprob_rows (LogprobBuffers.rows: token, rank, top ids, top values) of "raw" logits
        or "processed" (the processed logits / T: what the sampler draws from), and count each
        live [size] bool row's token. seed [size] int64, temperature [size] float32. Returns the
        processed [size, V] float32 (source "raw": greedy rows unwritten). Capturable."""
        tok_lp, rank, ids, vals = logprob_rows
        return default_ops(ops).process_draw(logits, self.counts, self.prompt, self.params, self.rule_ids, self.rule_vals,
                            self.rule_until, self._bias(self.counts.shape[0]), seed, step, temperature, live,
                            out, tok_lp, rank, ids, vals, source=source)

    def process_verify(self, logits: torch.Tensor, size: int, proposals: torch.Tensor, step: torch.Tensor,
                       temperature: torch.Tensor, *, ops: KernelOps | None = None) -> torch.Tensor:
        """The same processing for a speculative verify: logits [size * Q, V] of slots [0, size),
        row b * Q + j the distribution after proposals x_0 .. x_{j-1} (proposals [size, Q - 1]
        int64), drawn at index step[b] + j: counted as if those proposals had been drawn. step
        [size] int32, temperature [size] float32 -> [size * Q, V] float32. Capturable."""
        b, q1 = proposals.shape
        q, v = q1 + 1, self.vocab
        ahead = torch.zeros((b, q, v), dtype=torch.int32, device=logits.device)
        ahead[:, 1:].scatter_add_(2, proposals[:, :, None], torch.ones_like(proposals, dtype=torch.int32)[:, :, None])
        counts = (self.counts[:b, None] + ahead.cumsum(1, dtype=torch.int32)).view(b * q, v)
        rep = lambda t: t[:b].repeat_interleave(q, dim=0)
        draw = (step[:, None] + torch.arange(q, dtype=step.dtype, device=step.device)).reshape(b * q)
        bias = torch.zeros((b * q, v), dtype=torch.float32, device=logits.device)
        return default_ops(ops).process_logits(logits, counts, rep(self.prompt), self.params[:, :b].repeat_interleave(q, dim=1),
                              rep(self.rule_ids), rep(self.rule_vals), rep(self.rule_until), bias, draw,
                              temperature.repeat_interleave(q))

    def count(self, sel, tokens: torch.Tensor, live: torch.Tensor) -> None:
        """counts[slot, token] += 1 for each live row (tokens [b] int64, live [b] bool)."""
        add = live.to(torch.int32)[:, None]
        if isinstance(sel, int):
            self.counts[:sel].scatter_add_(1, tokens[:, None], add)
        else:
            at = sel * self.vocab + tokens
            self.counts.view(-1).index_add_(0, at, add[:, 0])


def drawn_from(x: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
               top_p: torch.Tensor, *, ops: KernelOps | None = None) -> torch.Tensor:
    """The distribution the sampler draws from, as logits: processed x [R, V] float32 divided by
    the temperature [R] (greedy rows: x), -inf outside the kept set of top_k [R] int32 / top_p [R]
    float32 (the sampler's own rule; ops: the kernel set, None: Triton's). Capturable."""
    order, kept = default_ops(ops).kept_lengths(x, temperature, top_k, top_p)                 # [R, V], [R]
    rank = torch.arange(x.shape[1], device=x.device)[None, :]
    inside = torch.zeros_like(x, dtype=torch.bool).scatter_(1, order, rank < kept[:, None])
    return torch.where(inside, x / torch.where(temperature > 0, temperature, 1.0)[:, None], -torch.inf)


__all__ = ["drawn_from", "ProcessRows", "ProcessState", "FOREVER", "RULE_WIDTH", "NUM_PARAMS", "NEUTRAL",
           "PRESENCE", "FREQUENCY", "REPETITION", "MIN_P"]
