"""Loading an EAGLE-3 head for the engine: the Eagle3Phase beside a ModelRuntime.

    phase = load_eagle3_phase(mrt, SpeculativeConfig(method="eagle3", draft_model=DIR, num_tokens=4))
    runner = SpeculativeRunner.attach(mrt, spec, eagle=phase, ...)

The head directory (either public layout) is checked against the target's LlamaSpec, fused in
the target's dtype on its device, shares the target's embedding table, reads RoPE up to the
runtime's max_context_len, and gets its own one-layer paged KV cache with the target's page ids
(as many pages as the target's pool, the head's own heads and head_dim), so the scheduler's pages
serve both. Where the target's prompts are graphed, the head's prompt pass joins their graphs
(Eagle3Phase.attach_prefill, before the runtime's capture).
"""
from __future__ import annotations


def load_eagle3_phase(mrt, spec):
    """spec.draft_model's EAGLE-3 head as an Eagle3Phase over caches indexed like mrt's.
    ValueError naming speculative.model when the head cannot be read or does not fit;
    TritonMissing where Triton is not installed (the head's kernels are Triton's)."""
    from graphrt.attention.kvcache import PagedKVCache
    from graphrt.checkpoint.hf_files import CheckpointError
    from graphrt.kernels.triton_import import require_triton
    require_triton("speculative.method 'eagle3' (its head runs graphrt's Triton kernels; 'ngram' and "
                   "'draft' run on a CPU without it)")
    from graphrt.speculative.eagle3 import Eagle3Drafter, Eagle3Head, load_eagle3
    from graphrt.speculative.eagle3.phase import Eagle3Phase
    model, c = mrt.model, mrt.config
    if getattr(model, "tp", None) is not None:
        raise ValueError("speculative.method: 'eagle3' is not supported with tensor parallelism yet")
    try:
        ck = load_eagle3(spec.draft_model, model.spec, dtype=model.dtype, device=mrt.device)
    except (OSError, CheckpointError, ValueError) as e:
        raise ValueError(f"speculative.model: cannot load the EAGLE-3 head {spec.draft_model!r}: {e}") from e
    head = Eagle3Head(ck.config, ck.weights, target_embed=model.weights.embed, max_positions=c.max_context_len)
    hc = ck.config
    rc = c.replace(num_qo_heads=hc.num_heads, num_kv_heads=hc.num_kv_heads, head_dim=hc.head_dim,
                   kv_cache_dtype="auto")   # the head's own cache: model dtype, also under an FP8 target cache
    cache = PagedKVCache.allocate(rc, mrt.num_pages, mrt.device, seed=c.seed + 2000)
    drafter = Eagle3Drafter(head, cache, spec.num_tokens, max_len=c.max_context_len, max_batch=c.max_batch)
    phase = Eagle3Phase(drafter, ck.layer_ids, target_hidden=model.spec.hidden_size, max_batch=c.max_batch,
                        dtype=model.dtype, device=mrt.device)
    phase.attach_prefill(mrt)     # graphed target prompts: they record the head's states and run its pass
    return phase


__all__ = ["load_eagle3_phase"]
