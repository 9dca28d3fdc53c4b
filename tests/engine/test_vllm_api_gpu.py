"""GPU tests of n > 1 (H200, bf16, CUDA graphs, FlashInfer): the samples of a greedy request
share the prompt's full pages, each gets its own device copy of the partial last page, and all
decode the same tokens as the greedy request alone in the same bucket (a wrong copy would make
samples 1.. diverge from sample 0, who keeps the original page); every page back at the end.

Run on the GPU machine: python -m pytest -m gpu -q tests/engine/test_vllm_api_gpu.py -s
"""
from __future__ import annotations

import pytest

from graphrt import LLM, SamplingParams

pytestmark = pytest.mark.gpu
pytest.importorskip("transformers")


def test_greedy_samples_share_pages_and_decode_identically(ckpt_8b):
    llm = LLM(model=str(ckpt_8b), device="cuda", max_num_seqs=8, steps_per_graph=4, max_model_len=512)
    eng, alloc = llm.engine, llm.engine.scheduler.allocator
    prompt = list(range(5, 5 + 37))                      # 2 full pages of 16 + 5 tokens
    greedy = dict(temperature=0.0, max_tokens=40, ignore_eos=True)
    stream = eng.add_request(prompt, SamplingParams(n=4, **greedy))
    eng.step()
    reqs = [r for r in eng.scheduler.slots if r is not None]
    assert len(reqs) == 4 and [alloc.refcount(p) for p in reqs[0].pages[:2]] == [4, 4]
    assert len({r.pages[2] for r in reqs}) == 4
    out = stream.result()
    ids = [o.token_ids for o in out.outputs]
    assert all(t == ids[0] for t in ids) and len(ids[0]) == 40
    sampled = llm.generate([prompt], SamplingParams(n=4, temperature=0.8, seed=7, max_tokens=16, ignore_eos=True),
                           use_tqdm=False)[0]
    assert len({tuple(o.token_ids) for o in sampled.outputs}) > 1
    assert alloc.num_free == alloc.num_pages
