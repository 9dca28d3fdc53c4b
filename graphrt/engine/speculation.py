"""Speculative decoding for the engine: the runner beside a ModelRuntime (and its draft model).

    runner = build_runner(mrt, SpeculativeConfig(method="ngram", num_tokens=4), rounds=4,
                          dtype="bfloat16", target=checkpoint)
    executor = LocalExecutor(mrt, runner)

Method "ngram" needs nothing more than the runtime's token history. Method "draft" loads the
draft checkpoint like the target (engine/loader.py, same dtype and device), checks that it shares
the target's vocabulary, and gives it its own paged KV caches with the target's page ids (the
same pool size, its own geometry), so the scheduler's pages serve both models.
"""
from __future__ import annotations

import torch


def build_runner(mrt, spec, *, rounds: int, dtype: str, target=None):
    """A SpeculativeRunner attached to mrt (its slots, graph runner, device-error flags), with
    top-k / top-p support (the filtered graphs)."""
    from graphrt.speculative.runner import SpeculativeRunner
    draft = None
    if spec.method == "draft":
        draft = load_draft(mrt, spec, dtype=dtype, target=target)
    return SpeculativeRunner.attach(mrt, spec, rounds=rounds, draft=draft, filtered=True)


def load_draft(mrt, spec, *, dtype: str, target=None):
    """The draft model of spec.draft_model as a DraftProposer over caches indexed like mrt's."""
    from graphrt.attention.kvcache import PagedKVCache
    from graphrt.engine.loader import load_checkpoint
    from graphrt.engine.model import build_model
    from graphrt.speculative.draft import DraftProposer
    try:
        ck = load_checkpoint(spec.draft_model, device=mrt.device, dtype=getattr(torch, dtype))
    except (OSError, ValueError) as e:
        raise ValueError(f"speculative.model: cannot load the draft checkpoint {spec.draft_model!r}: {e}") from e
    vocab = mrt.model.spec.vocab_size
    if ck.spec.vocab_size != vocab:
        raise ValueError(f"speculative.model: the draft's vocab_size {ck.spec.vocab_size} differs from "
                         f"the target's {vocab} (they must share a tokenizer)")
    c = mrt.config
    model = build_model(ck, max_positions=c.max_context_len)
    s = ck.spec
    rc = c.replace(num_qo_heads=s.num_heads, num_kv_heads=s.num_kv_heads, head_dim=s.head_dim)
    caches = [PagedKVCache.allocate(rc, mrt.num_pages, mrt.device, seed=c.seed + 1000 + i)
              for i in range(s.num_layers)]
    return DraftProposer(model, caches, spec.num_tokens, max_len=c.max_context_len)


__all__ = ["build_runner", "load_draft"]
