"""GPU tests of prompt chunks carried by decode blocks (mixed_prefill_tokens, model/mixed.py; H200,
bf16, CUDA graphs): the mixed graphs are captured; a long prompt arriving while rows decode rides
the blocks (and decodes in the block carrying its last piece) and every request follows HF
float32's greedy tokens (up to bf16 ties); a mixed block's launch (staging + replay) makes no
host sync.

Run on the GPU machine: python -m pytest -m gpu -q tests/engine/test_mixed_prefill_gpu.py -s
"""
from __future__ import annotations

import pytest
import torch

from _checkpoints import assert_greedy_matches_hf
from _engine_steps import drive
from graphrt import LLM, SamplingParams

pytestmark = pytest.mark.gpu
transformers = pytest.importorskip("transformers")
C = 128


@pytest.fixture(scope="module")
def llm(ckpt_8b):
    return LLM(ckpt_8b, device="cuda", max_batch=8, steps_per_graph=4, max_model_len=1024, num_pages=600,
               mixed_prefill_tokens=C)                  # a small pool: HF float32 fits beside it


def test_mixed_graphs_are_captured(llm):
    keys = [k for k in llm.runtime.runtime.graphs.stats if k.phase == "decode" and k.chunk]
    assert keys and all(k.chunk == C and not k.processed for k in keys)
    print(f"\nmixed graphs: {len(keys)} ({sorted({k.bucket for k in keys})} x greedy/sampled)")


def test_a_long_prompt_rides_the_blocks_with_hf_tokens(llm, ckpt_8b):
    eng = llm.engine
    eng.scheduler.record = True
    gen = torch.Generator().manual_seed(5)
    early = [torch.randint(2, 128256, (30 + 7 * i,), generator=gen).tolist() for i in range(3)]
    long = torch.randint(2, 128256, (600,), generator=gen).tolist()
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    streams = [eng.add_request(p, params) for p in early]
    eng.step()
    late = eng.add_request(long, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    drive(eng, max_steps=2000)
    kinds = [e[0] for e in eng.scheduler.launches if e[0] in ("prefill", "mixed") and e[1] == late.request_id]
    print(f"\nlate prompt's pieces: {kinds}; stats {eng.stats().get('prefill_mixed_chunks')}")
    assert len(kinds) >= 4 and set(kinds) == {"mixed"}      # no prefill launch of its own
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt_8b), dtype=torch.float32).cuda().eval()
    for p, s in zip(early + [long], streams + [late]):
        assert_greedy_matches_hf(hf, p, s.result().token_ids)
    a = eng.scheduler.allocator
    assert a.num_free == a.num_pages
    del hf
    torch.cuda.empty_cache()


def test_a_mixed_block_launch_makes_no_host_sync(llm):
    eng = llm.engine
    streams = [eng.add_request([5 + i] * (20 + 9 * i), SamplingParams(max_tokens=200, temperature=0.7, seed=i,
                                                                       ignore_eos=True)) for i in range(4)]
    for _ in range(3):
        eng.step()
    late = eng.add_request([9] * 700, SamplingParams(max_tokens=4, ignore_eos=True))
    eng._drain_inbox()
    eng.scheduler.admit()
    sched = eng.scheduler
    rows = sched.decode_rows()
    piece = sched.mixed_piece(eng.mixed_tokens, rows)
    assert piece is not None
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        eng._decode(rows, piece)                    # stage the chunk, flush, launch: no sync
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert eng.stats()["prefill_mixed_chunks"] >= 1
    for s in streams + [late]:
        eng.abort(s.request_id)
    drive(eng, max_steps=50)
    llm.runtime.check_device_errors()
