"""Replay-vs-reference verification of a runtime's buckets (used by graphrt-capture and tests)."""
from __future__ import annotations

import torch

from .reference import reference_decode

# relative L2 error allowed against the float32 reference, by dtype
TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 2e-2}


def verify_lengths(config) -> list[int]:
    """Lengths every bucket is checked at: 1, a page boundary and one past it, the maximum."""
    p, m = config.page_size, config.max_context_len
    return sorted({1, min(p, m), min(p + 1, m), m})


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


def verify_bucket(runtime, size: int, *, seed: int = 0, steps: int = 1) -> float:
    """Worst relative error over `steps` fresh full batches of `size` rows; output poisoned first."""
    gen = torch.Generator().manual_seed(seed)
    lengths = verify_lengths(runtime.config)
    worst = 0.0
    for _ in range(steps):
        q, table, lens = random_batch(runtime, size, lengths, gen)
        runtime.buffers.view(size).output.fill_(float("nan"))  # poison: every row must be written
        out = runtime.decode(q, table, lens).clone()
        k, v = runtime.kv_cache.as_tuple()
        ref = reference_decode(q, k, v, table, lens, layout=runtime.config.kv_layout)
        worst = max(worst, rel_error(out, ref))
    return worst
