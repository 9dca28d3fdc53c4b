"""How a step's tokens are drawn: one descriptor (Draw) and one function (draw) for every phase.

    how = Draw(sampled=True, processed=True, filtered=False)     # what a launch asks for
    src = draw(logits, rows, how, out, proc=state, sel=size, live=live, logprob_rows=...)

A decode step (model/runtime.py), a prefill's first token (worker/local.py) and a speculative
round's acceptance (speculative/runner.py: `how.processed`, `how.filtered`) read the same Draw.
The kernels, by what the Draw says (each from the model's kernel set, kernels/ops.py: the Triton
kernels or their torch references):
- greedy (not sampled, not processed): argmax (kernels/argmax.py);
- sampled: the seeded sampler over the rows' temperature / top_k / top_p (kernels/sample.py);
- processed: constrained rows' allowed-token masks (model/token_mask.py), then the rows' logits
  processing (model/processing.py: penalties, logit_bias,
  min_p, token rules), then the sampler, the drawn tokens counted for the penalties, and the
  log-probabilities read from the raw logits or the distribution drawn from; with
  filtered=False (a promise that no row uses top-k / top-p: no sort) and log-probability rows
  given, one fused pass does all of it (ProcessState.draw).
Everything here is capturable device work (no host sync, no allocation outside the sort).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from graphrt.kernels.ops import KernelOps, default_ops
from graphrt.model.processing import drawn_from


@dataclass(frozen=True)
class Draw:
    """sampled: some row samples (temperature > 0; else every row takes the argmax).
    processed: the rows' logits processing first, the drawn tokens counted, log-probabilities
    recorded (implies sampled: greedy rows are temperature-0 rows of the sampler).
    filtered: some row uses top-k / top-p; read with processing (False: the sampler skips its
    sort) and by speculative acceptance; a plain sampled draw always honours top-k / top-p."""

    sampled: bool = False
    processed: bool = False
    filtered: bool = False

    def __post_init__(self):
        for name in ("sampled", "processed", "filtered"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"draw.{name}: expected a bool, got {getattr(self, name)!r}")

    def key(self) -> "Draw":
        """The Draw a decode graph is captured for: processed implies sampled; filtered matters
        only with processing (a plain sampled graph always supports top-k / top-p)."""
        return Draw(sampled=self.sampled or self.processed, processed=self.processed,
                    filtered=self.processed and self.filtered)


@dataclass(frozen=True)
class DrawRows:
    """The sampling rows of the B rows drawn (device): temperature [B] float32 (0 = greedy),
    top_k [B] int32 (0 = off), top_p [B] float32 (1 = off), seed [B] int64, step [B] int32 (each
    row's draw index; += 1 by a sampled draw)."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    seed: torch.Tensor
    step: torch.Tensor


def draw(logits: torch.Tensor, rows: DrawRows, how: Draw, out: torch.Tensor, *, proc=None, sel=None,
         live: torch.Tensor | None = None, logprob_rows=None, source: str = "raw", mask=None,
         ops: KernelOps | None = None) -> torch.Tensor | None:
    """One token per row of logits [B, V] (model dtype or float32) into out [B] int64.

    proc / sel (how.processed): the ProcessState and the rows' slots (an int B: slots [0, B); or
    a [B] int64 index tensor); live [B] bool: rows whose draws are counted. logprob_rows: the
    step's LogprobBuffers.rows, which the fused pass (processed, not filtered) writes itself;
    source: "raw" (log-probs of the model's logits) or the processed distribution's.
    mask (how.processed): the runtime's TokenMask (model/token_mask.py); its constrained rows of
    sel get their disallowed tokens set to -inf in logits first (None: no constrained rows).
    ops: the model's kernel set (kernels/ops.py) every kernel here comes from (None: Triton's).
    Returns the [B, V] logits the caller reads log-probabilities from (processed draws that
    did not record them: LogprobBuffers.record / model.logprobs.token_logprobs), else None."""
    ops = default_ops(ops)
    if how.processed:
        if mask is not None:                                     # constrained rows: disallowed -> -inf
            mask.apply(logits, sel, ops=ops)
        if not how.filtered and logprob_rows is not None:       # process, draw, log-probs, count: fused
            proc.draw(logits, sel, rows.seed, rows.step, rows.temperature, live, out, logprob_rows, source=source,
                      ops=ops)
            return None
        x = proc.process(logits, sel, rows.step, rows.temperature, ops=ops)         # [B, V] float32
        src = logits if source == "raw" else drawn_from(x, rows.temperature, rows.top_k, rows.top_p, ops=ops)
        ops.sample_tokens(x, rows.temperature, rows.top_k, rows.top_p, rows.seed, rows.step, out,
                          filtered=how.filtered)
        proc.count(sel, out, live)
        return src
    if how.sampled:
        ops.sample_tokens(logits.contiguous(), rows.temperature, rows.top_k, rows.top_p, rows.seed, rows.step, out)
    else:
        ops.argmax_into(logits, out)                                                # greedy
    return None


__all__ = ["Draw", "DrawRows", "draw"]
