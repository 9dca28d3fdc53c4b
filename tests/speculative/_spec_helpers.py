"""Test helpers shared by tests/speculative/: the tiny target's config, prompts and block table,
plain greedy by full recomputation in HF transformers, a float32 multi-query paged-attention
reference, and a chi-square statistic."""
from __future__ import annotations

import torch

from graphrt import RuntimeConfig

PAGE, POOL, VOCAB = 16, 48, 64
CHI2_999 = {2: 13.816, 3: 16.266, 7: 24.322, 15: 37.697}     # chi-square quantile 0.999 by degrees of freedom


def runtime_config():
    """The tiny target's runtime (float32, torch-splitkv, POOL pages of PAGE tokens)."""
    return RuntimeConfig(num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=PAGE,
                         max_context_len=128, buckets=[1, 2, 4], dtype="float32",
                         backend="torch-splitkv", kv_pool_pages=POOL)


def sample_prompts():
    """Three prompts (int64 CPU tensors), two with a repeated pattern the n-gram proposer finds."""
    gen = torch.Generator().manual_seed(1)
    pattern = torch.randint(0, VOCAB, (6,), generator=gen)
    return [torch.cat([pattern.repeat(3), torch.randint(0, VOCAB, (3,), generator=gen)]),
            torch.randint(0, VOCAB, (9,), generator=gen),
            torch.cat([torch.randint(0, VOCAB, (4,), generator=gen), pattern.repeat(2)])]


def hf_greedy(hf, prompts, max_tokens):
    """Plain greedy decoding by full recomputation in HF transformers (float32)."""
    outs = []
    for p, m in zip(prompts, max_tokens):
        seq = p.tolist()
        with torch.no_grad():
            for _ in range(m):
                seq.append(int(hf(torch.tensor([seq])).logits[0, -1].argmax()))
        outs.append(seq[len(p):])
    return outs


def page_table():
    """[3, 8] int32 block table: 24 distinct pages of the pool in random order."""
    return torch.randperm(POOL, generator=torch.Generator().manual_seed(2))[:24].to(torch.int32).view(3, 8)


def multiquery_reference(q, cache, table, lens):
    """Float32 causal attention of q [B, nq, Hq, D] (the last nq of lens[r] positions) over the
    K/V gathered from `cache`'s pages through `table` [B, pages] (page size PAGE)."""
    b, nq, hq, d = q.shape
    k_all, v_all = cache.as_tuple()
    out = torch.zeros_like(q, dtype=torch.float32)
    for r in range(b):
        n = int(lens[r])
        if n == 0:
            continue
        pos = torch.arange(n)
        pages, slots = table[r].long()[pos // PAGE], pos % PAGE
        if cache.layout == "NHD":
            k, v = k_all[pages, slots], v_all[pages, slots]            # [n, Hkv, D]
        else:
            k, v = k_all[pages, :, slots], v_all[pages, :, slots]
        rep = hq // k.shape[1]
        k, v = k.repeat_interleave(rep, 1).float(), v.repeat_interleave(rep, 1).float()
        s = torch.einsum("qhd,nhd->hqn", q[r].float(), k) / d ** 0.5
        qpos = n - nq + torch.arange(nq)
        s = s.masked_fill(pos[None, None, :] > qpos[None, :, None], float("-inf"))
        out[r] = torch.einsum("hqn,nhd->qhd", torch.softmax(s, -1), v)
    return out


def chi2(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's statistic of integer `samples` against the distribution `probs`."""
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    expect = probs.double() * samples.numel()
    return float(((counts - expect) ** 2 / expect).sum())
