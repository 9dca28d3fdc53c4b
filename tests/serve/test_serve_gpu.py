"""GPU tests of `graphrt serve` (H200, bf16, CUDA graphs, FlashInfer): a live server over an
8B-shaped random checkpoint (2 layers) queried by 8 concurrent `openai` streaming clients; each
client's greedy tokens equal HF transformers' (bf16) up to HF's own top-2 ties; a disconnect frees
the pages; chat, stop strings and /metrics as on CPU.

Run on the GPU machine: python -m pytest -m gpu -q tests/serve/test_serve_gpu.py -s
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from _checkpoints import assert_greedy_matches_hf
from _serve_live import LiveServer, get_metrics, pages_full, wait_for

pytestmark = pytest.mark.gpu
openai = pytest.importorskip("openai")
transformers = pytest.importorskip("transformers")
NAME = "llama-8b-shaped"
GREEDY = dict(temperature=0.0, extra_body={"ignore_eos": True, "return_token_ids": True})


@pytest.fixture(scope="module")
def path(ckpt_8b):
    return ckpt_8b


@pytest.fixture(scope="module")
def llm(path):
    from graphrt import LLM
    return LLM(path, device="cuda", max_batch=8, steps_per_graph=4, max_model_len=1024)


@pytest.fixture(scope="module")
def live(llm):
    from graphrt.serve import ServeConfig, create_app
    with LiveServer(create_app(llm, ServeConfig(served_model_name=NAME))) as srv:
        yield srv


@pytest.fixture(scope="module")
def hf(path):
    return transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).cuda().eval()  # truth: bf16 weights, float32 math (and RoPE)


def test_eight_concurrent_streaming_clients_equal_hf(llm, hf, live):
    gen = torch.Generator().manual_seed(1)
    lens = [1, 7, 33, 100, 250, 400, 17, 64]
    prompts = [torch.randint(2, 128256, (m,), generator=gen).tolist() for m in lens]
    n = 24

    def run(p):
        c = live.client()
        chunks = list(c.completions.create(model=NAME, prompt=p, max_tokens=n, stream=True,
                                           stream_options={"include_usage": True}, **GREEDY))
        ids = sum((ch.choices[0].token_ids for ch in chunks if ch.choices), [])
        return ids, chunks[-1].usage.completion_tokens, [ch.choices[0].finish_reason for ch in chunks if ch.choices]

    with ThreadPoolExecutor(8) as ex:
        got = list(ex.map(run, prompts))
    for p, (ids, usage, reasons) in zip(prompts, got):
        assert len(ids) == n and usage == n and reasons[-1] == "length"
        assert_greedy_matches_hf(hf, p, ids)
    assert wait_for(lambda: pages_full(llm))


def test_chat_and_stop_on_gpu(llm, live):
    c = live.client()
    r = c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hello world"}],
                                  max_tokens=16, **GREEDY)
    assert r.usage.completion_tokens == 16 and r.choices[0].finish_reason == "length"
    ids = r.choices[0].token_ids
    stop_id = ids[5]
    r2 = c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hello world"}],
                                   max_tokens=16, temperature=0.0,
                                   extra_body={"ignore_eos": True, "stop_token_ids": [stop_id],
                                               "return_token_ids": True})
    assert r2.choices[0].finish_reason == "stop"
    assert r2.choices[0].token_ids == ids[:ids.index(stop_id) + 1]


def test_disconnect_frees_pages_and_metrics_on_gpu(llm, live):
    c = live.client()
    stream = c.completions.create(model=NAME, prompt=[5] * 100, max_tokens=900, stream=True, **GREEDY)
    next(iter(stream))
    stream.close()
    assert wait_for(lambda: pages_full(llm))
    m = get_metrics(live)
    assert m['graphrt_requests_finished_total{finish_reason="abort"}'] >= 1
    assert m["graphrt_kv_pages_used"] == 0 and m["graphrt_time_per_output_token_seconds_count"] >= 8
