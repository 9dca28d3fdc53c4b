"""The decode step as one persistent kernel (graphrt/kernels/persistent/) per bucket, and the choice.

    plan = PersistentPlan.build(model, kv_caches, buckets, "persistent", max_context_len=...,
                                cooperative=True, prefetch=None, stages=0)   # RuntimeOptions' persistent_*
    step = plan.get(rows)            # a PersistentStep, or None: the kernel sequence
    step.launch(tokens, seq_lens, block_table, out, device_error)   # greedy tokens into out

ModelRuntime's `decode_backend` (RuntimeOptions.decode_backend, model/options.py; the
environment's GRAPHRT_DECODE_BACKEND overrides it there: the A/B switch of tools/bench_e2e.py and
tools/profile_step.py):
- "sequence" (the default): today's kernel sequence (`LlamaDecoder.decode_step`) everywhere.
- "persistent": greedy decode blocks of buckets <= 16 rows run the persistent step where the
  model is supported (`unsupported`: one rank; linear weights in the model dtype, FP8 with
  per-channel / per-tensor scales, or int4 without act-order (kernels/persistent/formats.py);
  model-dtype KV pages; what is refused keeps the sequence, the reason logged), on CUDA and on
  CPU (the interpreter, one program). FP8 weights run W8A16 there (activations in the model
  dtype, the e4m3 codes converted in registers, the channel scale on the finished tile) where the
  sequence runs W8A8 (activations rounded to e4m3 per row): the two paths' logits differ by that
  rounding, a few % of the largest logit, and greedy tokens only where their margin is smaller.
- "auto": on CUDA, per bucket, both greedy graphs are captured, timed (device µs per replay)
  and dropped, and the persistent step is kept where it takes under MARGIN x the sequence's
  (`choose`); on CPU: the sequence.
Sampled, processed and mixed-chunk blocks, verify and prefill always run the kernel sequence.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

from graphrt.kernels.persistent.schedule import MAX_ROWS, Geometry
from graphrt.model.options import decode_backend_setting

if TYPE_CHECKING:       # the kernel (Triton) is imported where a step is built: CUDA, or asked for
    from graphrt.kernels.persistent.step import PersistentStep

log = logging.getLogger("graphrt.model")

MARGIN = 0.97                 # persistent must take under MARGIN x the sequence's step


def resolve_setting(setting) -> str:
    """"sequence", "persistent" or "auto" (any case) -> it in lower case; ValueError naming
    decode_backend otherwise (model/options.py; no environment is read here)."""
    return decode_backend_setting(setting)


def unsupported(model, kv_caches, rows: int) -> str | None:
    """Why `model` (a LlamaDecoder) cannot run the persistent step at `rows` rows (None: it can)."""
    if getattr(model, "tp", None) is not None:
        return "tensor parallel (one rank only)"
    from graphrt.kernels.persistent.step import unsupported as kernel_unsupported
    return kernel_unsupported(model.weights, kv_caches, rows)


def geometry(model) -> Geometry:
    s = model.local_spec
    return Geometry(s.num_layers, s.hidden_size, s.intermediate_size, s.num_heads, s.num_kv_heads, s.head_dim,
                    s.vocab_size)


def choose(timings_us: Mapping[tuple, float], rows: int) -> bool:
    """The decision (pure): persistent where its step takes under MARGIN x the sequence's."""
    return timings_us[(rows, "persistent")] < MARGIN * timings_us[(rows, "sequence")]


@dataclass
class PersistentPlan:
    """Decode rows -> PersistentStep (rows not listed: the kernel sequence); source "off",
    "fixed" or "measured"; candidates: the steps built (for "measured", `table` stays empty
    until the runtime has timed them); timings_us[(rows, "persistent" / "sequence")]; skipped:
    rows -> why the persistent step was not built."""
    table: dict = field(default_factory=dict)
    source: str = "off"
    candidates: dict = field(default_factory=dict)
    timings_us: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)

    def get(self, rows: int) -> PersistentStep | None:
        return self.table.get(rows)

    @classmethod
    def build(cls, model, kv_caches, buckets, setting: str, *, max_context_len: int, cooperative: bool = True,
              prefetch: int | None = None, stages: int = 0) -> "PersistentPlan":
        """The persistent steps of every bucket <= 16 rows the model supports (setting
        "persistent", or "auto" on CUDA: candidates the caller then measures); none for
        "sequence" or "auto" off CUDA. Allocates each step's tables and scratch (outside graphs).
        cooperative / prefetch / stages: PersistentStep's (a cooperative launch; the L2 prefetch
        distance, None: the device's default; the GEMV weight chunks in a shared-memory ring, 0:
        three in registers); off CUDA the step never prefetches."""
        s = resolve_setting(setting)
        cuda = model.weights.device.type == "cuda"
        if s == "sequence" or (s == "auto" and not cuda):
            return cls()
        from graphrt.kernels.persistent.step import PersistentStep
        plan = cls(source="fixed" if s == "persistent" else "measured")
        for rows in sorted({int(b) for b in buckets if b <= MAX_ROWS}):
            why = unsupported(model, kv_caches, rows)
            if why is None:
                plan.candidates[rows] = PersistentStep(model.weights, kv_caches, model.cos_sin, geometry=geometry(model),
                                                  rows=rows, eps=model.spec.rms_norm_eps,
                                                  max_context_len=max_context_len, cooperative=cooperative,
                                                  prefetch=prefetch if cuda else None, stages=stages)
            else:
                plan.skipped[rows] = why
        if s == "persistent":
            plan.table = dict(plan.candidates)
        if plan.skipped:
            log.info("graphrt: persistent decode step not built for rows %s", plan.skipped)
        return plan


__all__ = ["MARGIN", "PersistentPlan", "choose", "geometry", "resolve_setting", "unsupported"]
