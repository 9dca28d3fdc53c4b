"""What the engine asks the executor to run, and what comes back: launch descriptions and one result.

    res = ex.prefill(Prefill(prompts, table, slots=[3, 5], sampling=inputs))   # res.tokens [1, m]
    res = ex.prefill(Prefill(prompts, table, starts=[0, 64], after=[17, 9]))    # chunks: no draw
    res = ex.run(Block(n=4, draw=Draw(sampled=True)))                 # plain: res.tokens [K, n]
    res = ex.run(Block(n=4, k=2, draw=Draw()))                        # speculative: [R, n, k + 1]
    ex.run(Block(n=4, draw=Draw(True, True), part="forward"))         # constrained rows: one step
    res = ex.run(Block(n=4, draw=Draw(True, True), part="draw"))      # in two launches: [1, n]
    res = ex.run(Block(n=4, k=4, draw=Draw(True, True), rounds=1))    # constrained rows: one round
    res = ex.run(Block(n=4, changes=scheduler.take_changes()))        # slot changes applied first

A launch is plain host data (lists, CPU tensors, device tensors the engine drew), so a
tensor-parallel driver can send the same description to every rank. Every launch carries the
slot changes (changes.py) the scheduler recorded since the launch before it; the executor applies
them to the slots before it runs the launch (the one host writer of the slots). A Result's tensors are
device views valid until the next launch of the same kind (the engine copies them to the host
without a sync). Pure host code.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from graphrt.model.draw import Draw   # how a launch's tokens are drawn (one rule, every phase)
from graphrt.model.processing import ProcessRows
from graphrt.model.sampling import SamplingInputs
from graphrt.worker.changes import check_changes


@dataclass(frozen=True)
class Block:
    """One block over slots [0, n): k = 0, K plain decode steps (Capabilities.steps_per_graph);
    k > 0, R speculative rounds of k proposals (k in Capabilities.spec_ks).

    chunk: the block's first step also prefills the prompt chunk staged by `stage_chunk`
    (plain blocks of a runtime with mixed_tokens only; not with draw.processed).
    part: None, the whole block; "forward" / "draw", one step in two launches (draw.processed
    plain blocks only: constrained rows, whose allowed-token masks the engine writes after
    every token, between the two): "forward" runs the step's model (Result(None)); "draw", launched
    next over the same n, draws its tokens -> tokens [1, n].
    logprobs: the result carries the block's log-probabilities (draw.processed only; not with
    part "forward").
    rounds: None, the executor's R; 1, one speculative round (k > 0, draw.processed: a block
    holding constrained rows, Capabilities.spec_grammar) -> tokens [1, n, k + 1].
    sync_draft: with a proposer that keeps device state (Capabilities.draft_state), catch stale
    slots up first (False: rows at their limit, where the proposals no longer matter).
    changes: slot changes (changes.py) applied to the slots before the block runs."""

    n: int
    k: int = 0
    draw: Draw = Draw()
    chunk: bool = False
    part: str | None = None
    rounds: int | None = None
    logprobs: bool = False
    sync_draft: bool = True
    changes: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "changes", check_changes(self.changes))
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n: expected an int >= 1, got {self.n!r}")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 0:
            raise ValueError(f"k: expected an int >= 0 (0 = a plain block), got {self.k!r}")
        if not isinstance(self.draw, Draw):
            raise ValueError(f"draw: expected a Draw, got {type(self.draw).__name__}")
        if self.chunk and (self.k or self.draw.processed):
            raise ValueError("chunk: only in a plain block without logits processing")
        if self.part not in (None, "forward", "draw"):
            raise ValueError(f"part: expected None, 'forward' or 'draw', got {self.part!r}")
        if self.part is not None and (self.k or not self.draw.processed):
            raise ValueError(f"part: {self.part!r} only in a plain block (k = 0) with draw.processed")
        if self.rounds is not None and (self.rounds != 1 or not self.k or not self.draw.processed):
            raise ValueError(f"rounds: None (R) or 1 in a speculative block (k > 0) with draw.processed, "
                             f"got {self.rounds!r}")
        if self.logprobs and (not self.draw.processed or self.part == "forward"):
            raise ValueError("logprobs: a block records log-probabilities only with draw.processed "
                             "(and a draw: not part 'forward')")


@dataclass(frozen=True)
class Prefill:
    """Prefill prompts[i] (CPU or device [P_i] int64) into row i of block_table ([m, W] int32,
    CPU) from position starts[i] (default 0).

    slots None: pieces of contexts that draw nothing yet (chunks); after[i] is the token each
    piece's last position precedes (host int; an EAGLE-3 head pairs it with the piece's last
    hidden state). slots given: each slot's next token is drawn with sampling's row i from the
    last logits of prompt sources[i] (default i) and becomes the slot's current token.
    processing: the slots' processing rows (model/processing.py ProcessRows) written first and the
    first draws processed; logprobs: the result carries the first draws' log-probabilities;
    prompt_logprobs {row i: n}: those rows' prompt log-probabilities (CPU, whole prompts only).
    copies: (src, dst) KV pages copied after the prefill (n > 1: a sample's copy of a shared
    prompt's partial last page). defer_check: the K/V-append guards' flags are read with the
    next block's tokens, not here. draft False: a draft model's prefill is left for later (the
    slots start on plain decode). changes: slot changes (changes.py) applied to the slots before
    the prefill runs."""

    prompts: list
    block_table: torch.Tensor
    starts: list | None = None
    slots: list | None = None
    sampling: SamplingInputs | None = None
    after: list | None = None
    processing: ProcessRows | None = None
    logprobs: bool = False
    prompt_logprobs: dict | None = None
    sources: list | None = None
    copies: tuple = ()
    defer_check: bool = False
    draft: bool = True
    changes: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "changes", check_changes(self.changes))
        m = len(self.prompts)
        if self.starts is not None and len(self.starts) != m:
            raise ValueError(f"starts: {len(self.starts)} for {m} prompts")
        if self.slots is None:
            if self.sampling is not None or self.processing is not None or self.prompt_logprobs \
                    or self.sources is not None or self.copies or self.logprobs:
                raise ValueError("slots: a prefill that draws nothing takes no sampling, processing, "
                                 "log-probs, sources or copies")
            if self.after is not None and len(self.after) != m:
                raise ValueError(f"after: {len(self.after)} tokens for {m} prompts")
        elif self.sampling is None:
            raise ValueError("sampling: a prefill that draws (slots given) needs the slots' sampling rows")
        if self.logprobs and self.processing is None:
            raise ValueError("logprobs: the first draws' log-probabilities need processing rows")

    @property
    def draws(self) -> bool:
        return self.slots is not None


@dataclass
class Result:
    """What a launch returns (device views unless said otherwise).

    tokens: a plain block [K, n] int64; a speculative block [R, n, k + 1] int64 (-1 past each
    round's emitted tokens); a prefill that draws [1, m] int64; None for one that draws nothing.
    emitted / proposed: a speculative block's [R, n] int32 counts (None otherwise).
    logprobs: (token [S, cols] float32, rank [S, cols] int32, ids [S, cols, N] int64, vals
    [S, cols, N] float32) when the launch asked for them, else None.
    prompt_logprobs: {row: (logprob [P - 1], rank, ids, vals)} CPU (Prefill.prompt_logprobs).
    argmax: each row's argmax before masks and processing (whether a constrained row's model
    agreed with its grammar): a split step's draw (part "draw") [1, n] int64; a one-round
    speculative block with grammar-checked proposals [n, k + 1] int64, per verified position;
    None otherwise."""

    tokens: torch.Tensor | None
    emitted: torch.Tensor | None = None
    proposed: torch.Tensor | None = None
    logprobs: tuple | None = None
    prompt_logprobs: dict = field(default_factory=dict)
    argmax: torch.Tensor | None = None


__all__ = ["Draw", "Block", "Prefill", "Result"]
