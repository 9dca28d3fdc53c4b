"""Speculative sampling end to end at the acceptance level, on a toy bigram target (CPU, V = 5).

Proposals (n-gram lookup over each request's own tokens, a greedy draft bigram, or an EAGLE-3-like
chain whose first step reads the target's own state) + `judge` +
`advance`, round after round, against:
- an independent float64 reference of the filtered target distribution (temperature, top-k,
  top-p): chi-square over thousands of seeds on the joint of consecutive generated tokens; the
  same test FAILS for deliberately wrong acceptance rules;
- plain sampled decoding through the sampler (kernels/sample.py): identical tokens, seed by seed
  (one sampling rule); a seeded request draws the same tokens alone and in a batch.
"""
from __future__ import annotations

import math

import pytest
import torch

from graphrt.kernels.sample import sample_tokens
from graphrt.speculative.accept import advance, judge
from graphrt.speculative.ngram import ngram_propose, ngram_propose_reference

V = 5
PROMPT = [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1]        # n-gram lookup proposes the cycle i -> i + 1


def _table(seed: int, noise: float = 0.7, pull: float = 1.5) -> torch.Tensor:
    """Bigram logits [V, V]: row c = logits of the token after c, leaning to c + 1 (mod V)."""
    gen = torch.Generator().manual_seed(seed)
    t = torch.randn((V, V), generator=gen) * noise
    t[torch.arange(V), (torch.arange(V) + 1) % V] += pull
    return t


def _draft() -> torch.Tensor:
    """The draft bigram: the target's logits plus noise (agrees with it often, not always)."""
    return _table(0) + torch.randn((V, V), generator=torch.Generator().manual_seed(1)) * 0.6


def _filtered(row: torch.Tensor, temp: float, top_k: int, top_p: float) -> torch.Tensor:
    """float64 reference: greedy one-hot (lowest id among maxima), else softmax(l / T) over the
    top-k, then the smallest prefix of it whose mass reaches top_p, renormalised."""
    x = row.double()
    if temp <= 0:
        out = torch.zeros(V, dtype=torch.float64)
        out[int(torch.nonzero(x == x.max())[0])] = 1.0
        return out
    order = sorted(range(V), key=lambda i: (-float(x[i]), i))[: (top_k if 0 < top_k <= V else V)]
    w = torch.softmax(x[order] / temp, 0)
    kept, mass = [], 0.0
    for i, wi in zip(order, w.tolist()):
        if mass >= top_p:
            break
        kept.append(i)
        mass += wi
    out = torch.zeros(V, dtype=torch.float64)
    out[kept] = torch.softmax(x[kept] / temp, 0)
    return out


def _col(n, v, dt, device="cpu"):
    return v.to(device, dt) if isinstance(v, torch.Tensor) else torch.full((n,), v, dtype=dt, device=device)


def _propose(method, buf, num, k, draft):
    """Point-mass proposals [N, k] int64 and count [N] int32 for every row."""
    n = buf.shape[0]
    props = torch.zeros((n, k), dtype=torch.int64, device=buf.device)
    count = torch.zeros(n, dtype=torch.int32, device=buf.device)
    if method == "ngram-device":
        ngram_propose(buf, num, props, count, min_n=1, max_n=3)
    elif method == "ngram":                              # the same rule in Python (fast for many rows)
        for b in range(n):
            p = ngram_propose_reference(buf[b, : int(num[b])].tolist(), k, 1, 3)
            props[b, : len(p)] = torch.tensor(p, dtype=torch.int64)
            count[b] = len(p)
    elif method == "eagle3":                             # a head reading the target's own state:
        cur = buf.gather(1, (num.long() - 1)[:, None])[:, 0].long()   # d_1 from the target's logits
        cur = (_table(0)[cur] + draft[cur]).argmax(-1)                # at the current token (its
        props[:, 0] = cur                                             # hidden state), then a chain
        for j in range(1, k):
            cur = draft[cur].argmax(-1)
            props[:, j] = cur
        count.fill_(k)
    else:                                                # greedy chain over the draft bigram
        cur = buf.gather(1, (num.long() - 1)[:, None])[:, 0].long()
        for j in range(k):
            cur = draft[cur].argmax(-1)
            props[:, j] = cur
        count.fill_(k)
    return props, count


def speculate(target, prompts, gen, *, k, method, temp, top_k, top_p, seed, draft=None,
              rule="exact", filtered=True, stats=None):
    """Generate `gen` tokens per row by rounds of propose -> judge -> advance. prompts [N, L]
    int32; temp / top_k / top_p / seed: scalars or [N]. Returns [N, gen] int64."""
    n, length = prompts.shape
    dev = target.device
    temp, top_k = _col(n, temp, torch.float32, dev), _col(n, top_k, torch.int32, dev)
    top_p, seed = _col(n, top_p, torch.float32, dev), _col(n, seed, torch.int64, dev)
    width = length + gen + k + 1
    buf = torch.zeros((n, width), dtype=torch.int32, device=dev)
    buf[:, :length] = prompts.to(dev)
    num = torch.full((n,), length, dtype=torch.int32, device=dev)
    limit = torch.full((n,), length + gen, dtype=torch.int32, device=dev)
    step = torch.zeros(n, dtype=torch.int32, device=dev)
    q = k + 1
    acc = torch.empty((n, q), dtype=torch.int32, device=dev)
    fb = torch.empty((n, q), dtype=torch.int64, device=dev)
    out = torch.empty((n, q), dtype=torch.int64, device=dev)
    emitted = torch.empty(n, dtype=torch.int32, device=dev)
    gen_rng = torch.Generator().manual_seed(99)
    while bool((num < limit).any()):
        live = num < limit
        props, count = _propose(method, buf, num, k, draft)
        count = torch.where(live, count, 0)
        cur = buf.gather(1, (num.long() - 1)[:, None]).long()
        ctx = torch.cat([cur, props], 1)                                  # [N, Q]
        logits = target[ctx]                                             # [N, Q, V]
        kw = dict(top_k=top_k, top_p=top_p) if filtered else {}
        judge(logits.contiguous(), props, count, temp, seed, step, acc, fb, **kw)
        real = torch.arange(k, device=dev)[None, :] < count[:, None]
        if rule == "always-accept":                      # wrong: accept every real proposal
            acc[:, :k] = real.to(torch.int32)
        elif rule == "residual-keeps-x":                 # wrong: accept with p(x), but on reject
            p_x = torch.stack([torch.stack([_filtered(logits[b, j], float(temp[b]), int(top_k[b]),
                                                      float(top_p[b]))[int(props[b, j])]
                                            for j in range(k)]) for b in range(n)])
            u = torch.rand((n, k), generator=gen_rng, dtype=torch.float64)
            acc[:, :k] = ((u < p_x) & real).to(torch.int32)   # draw from all of p (x not removed)
        if stats is not None:
            stats["proposed"] += int(count.sum())
            stats["accepted"] += int((acc[:, :k].cumprod(1) * real).sum())
        advance(acc, fb, props, buf, num, limit, step, out, emitted)
    return buf[:, length: length + gen].long().cpu()


def plain_decode(target, prompts, gen, *, temp, top_k, top_p, seed):
    """Sampled decoding one token at a time through the sampler: [N, gen] int64."""
    n, dev = prompts.shape[0], target.device
    temp, top_k = _col(n, temp, torch.float32, dev), _col(n, top_k, torch.int32, dev)
    top_p, seed = _col(n, top_p, torch.float32, dev), _col(n, seed, torch.int64, dev)
    step = torch.zeros(n, dtype=torch.int32, device=dev)
    cur, outs = prompts[:, -1].long().to(dev), []
    for _ in range(gen):
        tok = torch.empty(n, dtype=torch.int64, device=dev)
        sample_tokens(target[cur].contiguous(), temp, top_k, top_p, seed, step, tok)
        outs.append(tok)
        cur = tok
    return torch.stack(outs, 1).cpu()


def _chi2_quantile(df: int, z: float = 3.09) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (z = 3.09: 0.999)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _chi2(pairs: torch.Tensor, probs: torch.Tensor) -> tuple[float, float]:
    """pairs [N, 2] tokens, probs [V, V] float64 -> (statistic, its 0.999 quantile). Cells of
    probability 0 must be empty; cells expecting < 5 draws are pooled."""
    n = pairs.shape[0]
    counts = torch.bincount(pairs[:, 0] * V + pairs[:, 1], minlength=V * V).double()
    probs = probs.reshape(-1)
    assert counts[probs == 0].sum() == 0, "a token outside the kept set was emitted"
    exp = probs * n
    big = exp >= 5
    obs = torch.cat([counts[big], counts[~big & (probs > 0)].sum()[None]])
    ex = torch.cat([exp[big], exp[~big & (probs > 0)].sum()[None]])
    keep = ex > 0
    stat = float(((obs[keep] - ex[keep]) ** 2 / ex[keep]).sum())
    return stat, _chi2_quantile(int(keep.sum()) - 1)


def _target_joint(target, temp, top_k, top_p):
    """Exact P(y1, y2) and P(y2, y3) after PROMPT under the filtered bigram: [V, V] float64 each."""
    p = torch.stack([_filtered(target[c], temp, top_k, top_p) for c in range(V)])   # p[c, y]
    first = p[PROMPT[-1]]
    j12 = first[:, None] * p
    j23 = (first @ p)[:, None] * p
    return j12, j23


SETTINGS = [(1.0, 0, 1.0), (0.8, 3, 1.0), (1.2, 0, 0.75), (1.0, 4, 0.85)]


@pytest.mark.parametrize("method,temp,top_k,top_p", [(m, *st) for m in ("ngram", "draft") for st in SETTINGS]
                         + [("eagle3", *SETTINGS[0]), ("eagle3", *SETTINGS[3])])
def test_speculative_sampling_follows_the_filtered_target(method, temp, top_k, top_p):
    n, target, draft = 3000, _table(0), _draft()
    prompts = torch.tensor(PROMPT, dtype=torch.int32).repeat(n, 1)
    seeds = torch.arange(n, dtype=torch.int64) * 7919 + 5
    stats = {"proposed": 0, "accepted": 0}
    toks = speculate(target, prompts, 3, k=2, method=method, temp=temp, top_k=top_k, top_p=top_p,
                     seed=seeds, draft=draft, stats=stats)
    rate = stats["accepted"] / stats["proposed"]
    assert 0.15 < rate < 0.95, rate                      # both branches exercised
    j12, j23 = _target_joint(target, temp, top_k, top_p)
    for pairs, probs in ((toks[:, :2], j12), (toks[:, 1:], j23)):
        stat, limit = _chi2(pairs, probs)
        assert stat < limit, (stat, limit)


@pytest.mark.parametrize("rule", ["always-accept", "residual-keeps-x"])
def test_a_wrong_acceptance_rule_fails_the_same_test(rule):
    n, target = 3000, _table(0)
    temp, top_k, top_p = SETTINGS[0]
    prompts = torch.tensor(PROMPT, dtype=torch.int32).repeat(n, 1)
    seeds = torch.arange(n, dtype=torch.int64) * 7919 + 5
    toks = speculate(target, prompts, 3, k=2, method="ngram", temp=temp, top_k=top_k, top_p=top_p,
                     seed=seeds, rule=rule)
    j12, _ = _target_joint(target, temp, top_k, top_p)
    stat, limit = _chi2(toks[:, :2], j12)
    assert stat > 3 * limit, (rule, stat, limit)


def _mixed_rows(n):
    gen = torch.Generator().manual_seed(4)
    prompts = torch.randint(0, V, (n, 10), generator=gen, dtype=torch.int32)
    prompts[: n // 2, :] = torch.tensor(PROMPT[:10], dtype=torch.int32)    # half repeat: matches
    temp = torch.tensor([0.0, 1.0, 0.7, 1.3] * (n // 4))
    top_k = torch.tensor([0, 0, 3, 2] * (n // 4), dtype=torch.int32)
    top_p = torch.tensor([1.0, 1.0, 0.9, 0.8] * (n // 4))
    seed = torch.arange(n, dtype=torch.int64) * 31 + 7
    return prompts, dict(temp=temp, top_k=top_k, top_p=top_p, seed=seed)


@pytest.mark.parametrize("method", ["ngram-device", "draft", "eagle3"])
def test_speculation_emits_the_tokens_of_plain_sampled_decoding(method):
    """One sampling rule: whatever is proposed, a seeded request emits what sampled decoding
    emits from the same logits (greedy rows included), token for token."""
    target, draft, n = _table(0), _draft(), 8
    prompts, params = _mixed_rows(n)
    want = plain_decode(target, prompts, 9, **params)
    stats = {"proposed": 0, "accepted": 0}
    got = speculate(target, prompts, 9, k=3, method=method, draft=draft, stats=stats, **params)
    assert stats["accepted"] > 0 and stats["accepted"] < stats["proposed"]
    assert torch.equal(got, want)


def test_a_seeded_request_draws_the_same_tokens_alone_and_in_a_batch():
    target, draft, n = _table(0), _draft(), 8
    prompts, params = _mixed_rows(n)
    batch = speculate(target, prompts, 9, k=3, method="draft", draft=draft, **params)
    perm = torch.tensor([5, 2, 7, 0, 3, 6, 1, 4])
    shuffled = speculate(target, prompts[perm], 9, k=3, method="draft", draft=draft,
                         **{name: t[perm] for name, t in params.items()})
    assert torch.equal(shuffled, batch[perm])
    for r in (0, 1, 3):                                  # alone; rows 0, 1 unfiltered: no-sort path
        one = {name: t[r: r + 1] for name, t in params.items()}
        alone = speculate(target, prompts[r: r + 1], 9, k=3, method="draft", draft=draft,
                          filtered=bool(one["top_k"][0] > 0 or one["top_p"][0] < 1), **one)
        assert torch.equal(alone, batch[r: r + 1]), r


@pytest.mark.gpu
def test_gpu_speculation_follows_the_target_and_emits_plain_decode_tokens():
    """The same checks with the compiled kernels on CUDA (one row per program): 20,000 seeds."""
    target, draft = _table(0).cuda(), _draft().cuda()
    temp, top_k, top_p = SETTINGS[3]
    n = 20000
    prompts = torch.tensor(PROMPT, dtype=torch.int32).repeat(n, 1)
    seeds = torch.arange(n, dtype=torch.int64) * 7919 + 5
    toks = speculate(target, prompts, 3, k=2, method="draft", temp=temp, top_k=top_k, top_p=top_p,
                     seed=seeds, draft=draft)
    j12, j23 = _target_joint(target.cpu(), temp, top_k, top_p)
    for pairs, probs in ((toks[:, :2], j12), (toks[:, 1:], j23)):
        stat, limit = _chi2(pairs, probs)
        assert stat < limit, (stat, limit)
    prompts, params = _mixed_rows(8)
    want = plain_decode(target, prompts, 9, **params)
    for method in ("ngram-device", "draft"):
        got = speculate(target, prompts, 9, k=3, method=method, draft=draft, **params)
        assert torch.equal(got, want), method
