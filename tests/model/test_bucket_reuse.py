"""A bucket's padding rows (graphrt/model/runtime.py): a bucket served with more rows and then
reused with fewer must write only the served rows' pages. A padding row left with its stale
seq_len and block-table row would decode again and write K/V into a page its old request no
longer owns (whichever request holds it now). Through the public API on CPU:
the public decode(), which loads the runtime's slots (the engine writes them through its input
batch and clears a released row's length)."""
from __future__ import annotations

import pytest
import torch

from graphrt import RuntimeConfig
from graphrt.model import LlamaDecoder
from graphrt.model.runtime import ModelRuntime

transformers = pytest.importorskip("transformers")
PAGE, K, POOL = 16, 2, 40


def _runtime():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=160, hidden_size=128, intermediate_size=224, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                                   tie_word_embeddings=False)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    rc = RuntimeConfig(num_qo_heads=2, num_kv_heads=1, head_dim=64, page_size=PAGE, max_context_len=64,
                       buckets=[4], dtype="float32", backend="torch", kv_pool_pages=POOL)
    return ModelRuntime(LlamaDecoder.from_hf(hf), rc, "cpu", steps_per_graph=K)


def _written(table, seq, rows) -> set[tuple[int, int]]:
    """(page, slot in page) each served row writes in one K-step call: positions seq-1 .. seq+K-2."""
    return {(int(table[r, p // PAGE]), p % PAGE) for r in rows for p in range(int(seq[r]) - 1, int(seq[r]) + K - 1)}


@pytest.mark.parametrize("entry", ["decode"])
@pytest.mark.parametrize("first,second", [(3, 2), (4, 1)])
def test_bucket_reused_with_fewer_rows_writes_only_the_served_rows_pages(entry, first, second):
    mrt = _runtime()
    gen = torch.Generator().manual_seed(first * 10 + second)
    table = (torch.randperm(POOL - 1, generator=gen)[:4 * 4] + 1).to(torch.int32).view(4, 4)   # 4 pages a row
    lens = torch.tensor([9, 20, 30, 41], dtype=torch.int32)[:first]
    mrt.prefill([torch.randint(0, 160, (int(x) - 1,), generator=gen) for x in lens], table[:first])
    cur = torch.randint(0, 160, (first,), generator=gen)

    def call(n, tokens, seq):
        return mrt.decode(tokens[:n].clone(), table[:n], seq[:n]).clone()

    out = call(first, torch.cat([cur, torch.zeros(4 - first, dtype=torch.int64)]), lens)  # the bucket, `first` rows
    seq = lens + K
    before = [(c.k.clone(), c.v.clone()) for c in mrt.kv_caches]
    nxt = torch.cat([out[-1], torch.zeros(4 - first, dtype=torch.int64)])
    call(second, nxt, seq)                                                     # reused with fewer rows
    written = _written(table, seq, range(second))
    changed = set()
    for c, (k0, v0) in zip(mrt.kv_caches, before):
        for t, t0 in ((c.k, k0), (c.v, v0)):
            diff = (t != t0).reshape(POOL, PAGE, -1).any(-1)        # NHD: [pages, page_size, heads, D]
            changed |= {(int(p), int(s)) for p, s in diff.nonzero().tolist()}
    assert changed == written, (f"slots changed outside the served rows: {sorted(changed - written)}; "
                                f"not written: {sorted(written - changed)}")
