"""Replay-vs-reference verification of a runtime's buckets (used by graphrt-capture and tests).

A `VerifyPlan` says which buckets are verified and at which request lengths. On a GPU the plan is
full (every bucket, lengths 1, a page boundary and one past it, the maximum). On a CPU the same
pipeline runs eagerly, with the prepare kernel in Triton's interpreter and a float32 torch
executor, which costs seconds per step at large buckets and long contexts; `cpu_plan` picks a
subset that fits a fixed cost budget (the smallest bucket, the two sides of the nominal planner's
split boundary, then whatever else fits) and caps the lengths. Callers must say so when a plan
is not full.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from graphrt.attention.flashinfer_layout import nominal_spec
from graphrt.attention.reference import reference_decode

# relative L2 error allowed against the float32 reference, by dtype
TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 2e-2}

# CPU verification budget, in interpreted prepare-kernel programs per step (a request row counts
# as CPU_ROW_COST programs: the torch executor and the reference loop over rows). Measured on a
# loaded 2-core machine: ~12 ms per program, ~0.1 s per row at lengths <= 2048, and graphrt-capture
# runs ~5 steps per verified bucket; 2,500 units keep a preset to about 2.5 minutes there.
CPU_BUDGET = 2500
CPU_ROW_COST = 8
CPU_MAX_LEN = 2048  # longest verification length on a CPU (executor and reference are O(length))


@dataclass(frozen=True)
class VerifyPlan:
    """Buckets to verify (sorted subset of config.buckets) and the request lengths each bucket's
    rows cycle through (sorted, each in [1, max_context_len])."""

    buckets: tuple[int, ...]
    lengths: tuple[int, ...]

    def is_full(self, config) -> bool:
        """True when this plan verifies every bucket at every standard length."""
        return self == full_plan(config)


def verify_lengths(config) -> list[int]:
    """Lengths every bucket is checked at: 1, a page boundary and one past it, the maximum."""
    p, m = config.page_size, config.max_context_len
    return sorted({1, min(p, m), min(p + 1, m), m})


def full_plan(config) -> VerifyPlan:
    return VerifyPlan(tuple(config.buckets), tuple(verify_lengths(config)))


def make_plan(config, *, buckets=None, lengths=None) -> VerifyPlan:
    """A plan from explicit buckets / lengths (None = all buckets / the standard lengths).

    Raises ValueError starting with the field name ("buckets:" / "lengths:") on a bucket that is
    not one of the config's or a length outside [1, max_context_len]."""
    full = full_plan(config)
    b = full.buckets if buckets is None else tuple(sorted(set(int(x) for x in buckets)))
    n = full.lengths if lengths is None else tuple(sorted(set(int(x) for x in lengths)))
    bad_b = [x for x in b if x not in config.buckets]
    if not b or bad_b:
        raise ValueError(f"buckets: {list(bad_b) or 'none given'}: must be among the config's "
                         f"buckets {list(config.buckets)}")
    bad_n = [x for x in n if not 1 <= x <= config.max_context_len]
    if not n or bad_n:
        raise ValueError(f"lengths: {list(bad_n) or 'none given'}: each must be in "
                         f"[1, max_context_len={config.max_context_len}]")
    return VerifyPlan(b, n)


def cpu_step_cost(config, bucket: int) -> int:
    """Cost units of one eager CPU step of `bucket` (see CPU_BUDGET)."""
    from graphrt.kernels.prepare import BLOCK_P, BLOCK_T     # the prepare kernel's (Triton) programs
    padded = nominal_spec(config.decode_kernel, bucket, config.page_size,
                          config.num_kv_heads).padded_batch_size
    programs = (bucket + -(-padded // BLOCK_T)) * -(-config.max_pages_per_seq // BLOCK_P)
    return programs + CPU_ROW_COST * bucket


def cpu_plan(config, *, budget: int = CPU_BUDGET, max_len: int = CPU_MAX_LEN) -> VerifyPlan | None:
    """The buckets and lengths verified on a CPU within `budget`; None if not even one fits.

    Buckets by priority: the smallest; the largest the nominal planner splits and the smallest it
    does not (both plan shapes); the largest; then the rest from small to large; each is taken if
    it still fits. Lengths: the standard ones, the maximum capped at `max_len`."""
    buckets = list(config.buckets)
    split = {b: nominal_spec(config.decode_kernel, b, config.page_size, config.num_kv_heads).split_kv
             for b in buckets}
    priority = [buckets[0]]
    priority += [b for b in buckets if split[b]][-1:] + [b for b in buckets if not split[b]][:1]
    priority += [buckets[-1]] + buckets
    chosen, spent = [], 0
    for b in dict.fromkeys(priority):  # ordered, without repeats
        cost = cpu_step_cost(config, b)
        if spent + cost <= budget:
            chosen.append(b)
            spent += cost
    if not chosen:
        return None
    lengths = {min(x, max_len) for x in verify_lengths(config)}
    return VerifyPlan(tuple(sorted(chosen)), tuple(sorted(lengths)))


def random_batch(runtime, n: int, lengths: list[int], gen: torch.Generator):
    """Fresh random q / block_table / seq_lens for n requests cycling through `lengths`."""
    c, dev = runtime.config, runtime.device
    q = torch.randn((n, c.num_qo_heads, c.head_dim), generator=gen).to(dev, c.torch_dtype)
    table = torch.randint(0, runtime.kv_cache.num_pages, (n, c.max_pages_per_seq), generator=gen,
                          dtype=torch.int32).to(dev)
    lens = torch.tensor([lengths[i % len(lengths)] for i in range(n)], dtype=torch.int32).to(dev)
    return q, table, lens


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.float(), ref.float()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def reference_by_length(q, k, v, table, lens, *, layout: str, k_scale=1.0, v_scale=1.0) -> torch.Tensor:
    """reference_decode with the rows sorted by length (it pads each chunk of rows to the chunk's
    longest, so mixed lengths would cost the maximum for every row); same result, row order kept."""
    order = torch.argsort(lens.cpu(), stable=True).to(q.device)
    ref = torch.empty_like(q)
    ref[order] = reference_decode(q[order], k, v, table[order], lens[order], layout=layout,
                                  k_scale=k_scale, v_scale=v_scale)
    return ref


def verify_bucket(runtime, size: int, *, seed: int = 0, steps: int = 1,
                  lengths: list[int] | tuple[int, ...] | None = None) -> float:
    """Worst relative error over `steps` fresh full batches of `size` rows; output poisoned first.

    Rows cycle through `lengths` (default: verify_lengths of the runtime's config)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = list(lengths) if lengths is not None else verify_lengths(runtime.config)
    worst = 0.0
    for _ in range(steps):
        q, table, lens = random_batch(runtime, size, lengths, gen)
        runtime.buffers.view(size).output.fill_(float("nan"))  # poison: every row must be written
        out = runtime.decode(q, table, lens).clone()
        k, v = runtime.kv_cache.as_tuple()
        k_scale, v_scale = runtime.kv_cache.kv_scales()           # FP8 pages: dequantized
        ref = reference_by_length(q, k, v, table, lens, layout=runtime.config.kv_layout,
                                  k_scale=k_scale, v_scale=v_scale)
        worst = max(worst, rel_error(out, ref))
    return worst
