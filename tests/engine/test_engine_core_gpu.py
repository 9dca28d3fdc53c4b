"""GPU tests of the engine core (H200, bf16, CUDA graphs): a pool too small for the batch preempts
and every request still matches HF's greedy tokens (up to bf16 ties); the block launch (its
slot changes applied, trusted decode, device advance) makes no host sync; the pool sized from memory.

Run on the GPU machine: python -m pytest -m gpu -q tests/engine/test_engine_core_gpu.py -s
"""
from __future__ import annotations

import pytest
import torch
from graphrt.worker.launch import Block, Draw

from _checkpoints import assert_greedy_matches_hf
from _engine_steps import drive, prefill_sync_sites
from graphrt import LLM, SamplingParams

pytestmark = pytest.mark.gpu
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def path(ckpt_8b):
    return ckpt_8b


def test_preempted_requests_finish_with_the_greedy_tokens(path):
    # 12 requests of 100-160 prompt tokens + 96 new: up to 17 pages of 16 each (204 for all);
    # the pool has 60, so rows grow into it and the newest are preempted and recomputed
    llm = LLM(path, device="cuda", max_batch=12, steps_per_graph=4, max_model_len=512, num_pages=60)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(2, 128256, (int(m),), generator=gen).tolist()
               for m in torch.randint(100, 160, (12,), generator=gen)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=96, temperature=0, ignore_eos=True))
    sched = llm.engine.scheduler
    print(f"\npreemptions: {sched.num_preemptions}")
    assert sched.num_preemptions > 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).cuda().eval()
    for p, o in zip(prompts, outs):
        assert o.finish_reason == "length" and len(o.token_ids) == 96
        assert_greedy_matches_hf(hf, p, o.token_ids)
    assert sched.allocator.num_free == sched.allocator.num_pages


def test_block_launch_makes_no_host_sync(path):
    llm = LLM(path, device="cuda", max_batch=8, steps_per_graph=4, max_model_len=512)
    eng = llm.engine
    streams = [eng.add_request([5 + i] * (20 + 9 * i), SamplingParams(max_tokens=200, temperature=0.7, seed=i,
                                                                       ignore_eos=True)) for i in range(6)]
    for _ in range(3):
        eng.step()                                   # admitted, prefilled, decoding
    sched = eng.scheduler
    rows = sched.decode_rows()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(6):                           # pages grow, rows are written and advanced
            rows = sched.grow(rows)                  # the launch half of Engine._decode
            go = sched.launch_block(rows)
            llm.runtime.run(Block(go.n, draw=Draw(sampled=go.sampled), changes=go.changes))   # slots advance on the device
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    llm.runtime.check_device_errors()
    for s in streams:
        eng.abort(s.request_id)
    drive(eng, max_steps=20)


def test_prefill_admission_makes_few_host_syncs(path):
    """An admission's prefill (prompts checked on the host, copied with their block table and
    plan through pinned memory, FlashInfer planned from host indptrs, logits-processing rows
    written from pinned memory) makes few synchronising calls. On the H200 the path made 18 (plan
    copies, prompt checks on the device, index tensors), then 7 (the K/V error-flag read and 6 in
    ProcessingState.write_rows), then 1: the error-flag read, then 0. The sites are printed."""
    llm = LLM(path, device="cuda", max_batch=8, steps_per_graph=4, max_model_len=512)
    eng = llm.engine
    streams = [eng.add_request([7 + i] * (40 + 13 * i), SamplingParams(max_tokens=8, ignore_eos=True))
               for i in range(3)]
    sites = prefill_sync_sites(eng)
    print("prefill sync sites:", len(sites), sites)
    assert sites == [], sites     # H200: 0 since the flags travel with the block (round 16, the EAGLE-3 test's plain base)
    drive(eng, max_steps=50)
    assert [len(s.result().token_ids) for s in streams] == [8, 8, 8]


def test_pool_is_sized_from_free_memory(path):
    llm = LLM(path, device="cuda", max_batch=128, steps_per_graph=8, max_model_len=8192)
    cap = llm.config.max_batch * llm.config.pages_per_seq(8192)
    pages = llm.engine.scheduler.allocator.num_pages
    free, total = torch.cuda.mem_get_info()
    print(f"\npool: {pages} pages (cap {cap}); GPU {free / 2**30:.1f} of {total / 2**30:.1f} GiB free")
    assert 0 < pages <= cap and llm.runtime.caps.num_pages == pages + 1
    assert total - free <= 0.9 * total + (1 << 30)   # the utilization (plus this test's slack)
