"""What an executor can do: one frozen object the engine reads once, instead of probing.

    caps = executor.caps                       # after capture (steps_per_graph "auto" is fixed there)
    caps.steps_per_graph, caps.spec_ks, caps.processing, caps.mixed_tokens, ...
    caps.refuse("logprobs", caps.logprobs_width >= 5, "at most the captured width")   # ValueError

A feature an executor lacks is a field set to False / 0 / () / None here, and the engine refuses
a request or a configuration that asks for it with a ValueError naming the field (never an
AttributeError from a missing method, never a `getattr(executor, "feature", False)` probe).
Pure host data; nothing here touches a device.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from graphrt.config import RuntimeConfig
from graphrt.kernels.ops import KERNELS
from graphrt.speculative.config import SpeculativeConfig


@dataclass(frozen=True)
class Capabilities:
    """config: the RuntimeConfig the executor runs (buckets, max_batch, page_size,
    max_pages_per_seq, max_context_len); device: where its slot rows live; num_pages: its KV
    pool's pages (page 0 included); vocab_size: the model's; model_key: what changes a KV
    page's contents (model class, spec, runtime config), the prefix cache's seed.

    steps_per_graph: K, the decode steps of one plain block; speculative: the
    SpeculativeConfig (None: no speculation); spec_ks: the proposal counts a speculative block
    may run (one graph family each; () without speculation); spec_rounds: R, rounds a
    speculative block (its processed rounds record log-probabilities as plain blocks do).

    processing: logits processing (penalties, logit_bias, min_p, bad_words, min_tokens) and
    log-probabilities in decode and prefill; logprobs_width: the most log-probs a draw keeps (0
    without processing); structured: per-slot allowed-token masks for constrained decoding
    (`Executor.write_token_mask`, read by the processed draws; needs processing); spec_grammar:
    speculative blocks may hold constrained rows (n-gram proposals, each slot capped at its
    grammar-checked ones, verified under masks of 1 + spec_tokens positions: Block(k=spec_tokens,
    rounds=1)); mixed_tokens: C > 0, a plain block may carry a prompt chunk of up to C
    tokens in its first step (0: none); history_width: the token history's width (None: no
    history kept); draft_state: the proposer keeps per-slot device state of its own (a draft
    model's K/V), caught up after plain blocks; shared_prefill: samples of one prompt (n > 1) may
    share one prefill (False for an EAGLE-3 head, which prefills every sample);
    kernels: the model's per-layer kernel set (kernels/ops.py: "triton" or "torch");
    device_errors: the executor keeps sticky device-guard flags (`Executor.error_flag`);
    tensor_parallel: ranks the executor drives (1: this process alone)."""

    config: RuntimeConfig
    device: torch.device
    num_pages: int
    vocab_size: int
    model_key: str
    steps_per_graph: int
    speculative: SpeculativeConfig | None = None
    spec_ks: tuple[int, ...] = ()
    spec_rounds: int = 0
    processing: bool = False
    logprobs_width: int = 0
    structured: bool = False
    spec_grammar: bool = False
    mixed_tokens: int = 0
    history_width: int | None = None
    draft_state: bool = False
    shared_prefill: bool = True
    kernels: str = "triton"
    device_errors: bool = False
    tensor_parallel: int = 1

    def __post_init__(self):
        for name in ("num_pages", "vocab_size", "steps_per_graph"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
        for name in ("spec_rounds", "logprobs_width", "mixed_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name}: expected an int >= 0, got {v!r}")
        if (self.speculative is None) != (not self.spec_ks):
            raise ValueError(f"spec_ks: {self.spec_ks!r} with speculative={self.speculative!r} (both or neither)")
        if any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in self.spec_ks) \
                or list(self.spec_ks) != sorted(set(self.spec_ks)):
            raise ValueError(f"spec_ks: expected ascending distinct ints >= 1, got {self.spec_ks!r}")
        if self.spec_ks and self.spec_rounds < 1:
            raise ValueError(f"spec_rounds: expected >= 1 with speculation, got {self.spec_rounds}")
        if self.logprobs_width and not self.processing:
            raise ValueError(f"logprobs_width: {self.logprobs_width} without processing (log-probs need it)")
        if self.kernels not in KERNELS:
            raise ValueError(f"kernels: {self.kernels!r} is not one of {list(KERNELS)}")
        if self.structured and not self.processing:
            raise ValueError("structured: allowed-token masks without processing (the processed draws read them)")
        if self.spec_grammar and (not self.structured or self.speculative is None):
            raise ValueError("spec_grammar: needs structured and speculative")
        if self.history_width is not None and (isinstance(self.history_width, bool)
                                               or not isinstance(self.history_width, int) or self.history_width < 1):
            raise ValueError(f"history_width: expected None or an int >= 1, got {self.history_width!r}")
        if isinstance(self.tensor_parallel, bool) or not isinstance(self.tensor_parallel, int) \
                or self.tensor_parallel < 1:
            raise ValueError(f"tensor_parallel: expected an int >= 1, got {self.tensor_parallel!r}")

    @property
    def spec_tokens(self) -> int:
        """The configured proposals a round (0 without speculation)."""
        return 0 if self.speculative is None else self.speculative.num_tokens

    def refuse(self, field: str, ok: bool, why: str) -> None:
        """ValueError naming `field` unless `ok` (a request or a config asking for what this
        executor cannot do)."""
        if not ok:
            where = "" if self.tensor_parallel == 1 else f" (tensor_parallel={self.tensor_parallel})"
            raise ValueError(f"{field}: {why}{where}")


__all__ = ["Capabilities"]
