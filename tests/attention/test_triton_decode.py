"""Backend 'triton-decode' (graphrt's one-launch split-KV kernel) on CPU: per-bucket MAX_SPLITS and
scratch, mixed with another backend per bucket, graphrt-capture's auto candidates and choice,
the whole-model step (ModelRuntime) against HF transformers, and the config / engine options.
The DecodeRuntime suite (tests/attention/test_runtime.py) and the FP8 decode tests
(tests/attention/test_fp8_kv_decode.py) run it too; GPU: tests/attention/test_decode_attention_gpu.py."""
from __future__ import annotations

import pytest
import torch

from graphrt import DecodeRuntime, PagedKVCache, RuntimeConfig
from graphrt.attention.backends import make_backend
from graphrt.attention.backends.triton_decode import TritonDecodeBackend
from graphrt.kernels.decode_attention import NOMINAL_SMS
from graphrt.attention.reference import reference_decode
from graphrt.config import ConfigError
from graphrt.kernels.decode_attention import default_max_splits

HQ, HKV, D, PAGE, CTX, POOL = 8, 2, 64, 16, 512, 80


def _config(**kw):
    kw = dict(num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D, page_size=PAGE, max_context_len=CTX,
              buckets=[1, 2, 4, 8], dtype="float32", backend="triton-decode", kv_pool_pages=POOL) | kw
    return RuntimeConfig(**kw)


def _batch(n, gen, lens=None):
    lens = torch.randint(0, CTX + 1, (n,), generator=gen, dtype=torch.int32) if lens is None else \
        torch.tensor(lens, dtype=torch.int32)
    table = torch.randint(0, POOL, (n, CTX // PAGE), generator=gen, dtype=torch.int32)
    return torch.randn((n, HQ, D), generator=gen), table, lens


def test_splits_and_scratch_per_bucket():
    cfg = _config()
    rt = DecodeRuntime(cfg, PagedKVCache.allocate(cfg, POOL, "cpu"), "cpu")
    rt.capture()
    be = rt.backend
    assert isinstance(be, TritonDecodeBackend) and be.sms == NOMINAL_SMS
    want = {b: default_max_splits(NOMINAL_SMS, b, HKV, CTX) for b in cfg.buckets}
    assert be.max_splits == want and want[1] == 8                 # 512 keys: at most 8 splits of 64
    assert be.scratch.partial.shape[0] == max(b * s for b, s in want.items() if s > 1) * HKV
    assert be.scratch.counters.shape == (8 * HKV,)
    assert [r["max_splits"] for r in rt.report()] == [want[b] for b in cfg.buckets]


def test_mixed_bucket_backends_match_reference():
    cfg = _config()
    kv = PagedKVCache.allocate(cfg, POOL, "cpu", seed=2)
    rt = DecodeRuntime(cfg, kv, "cpu", bucket_backends={1: "triton-decode", 2: "torch-splitkv",
                                                        4: "triton-decode", 8: "triton-decode"})
    rt.capture()
    gen = torch.Generator().manual_seed(3)
    for n, lens in [(1, [512]), (2, None), (3, [0, 129, 64]), (8, None), (1, [1])]:
        q, table, lens = _batch(n, gen, lens)
        out = rt.decode(q, table, lens)
        want = reference_decode(q, kv.k, kv.v, table, lens)
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    assert rt.backend_for(2).name == "torch-splitkv" and rt.backend_for(4).name == "triton-decode"
    assert rt.backend_for(4).scratch.counters.eq(0).all()


def test_max_splits_override_and_bad_values():
    cfg = _config()
    kv = PagedKVCache.allocate(cfg, POOL, "cpu")
    be = TritonDecodeBackend(cfg, kv, torch.device("cpu"), max_splits={1: 3})
    rt = DecodeRuntime(cfg, kv, "cpu")
    be.setup([rt.buffers.view(b) for b in reversed(cfg.buckets)])
    assert be.max_splits[1] == 3 and be.max_splits[8] == default_max_splits(NOMINAL_SMS, 8, HKV, CTX)
    for bad in ({1: 0}, {1: True}, [3]):
        with pytest.raises(ValueError, match="max_splits"):
            TritonDecodeBackend(cfg, kv, torch.device("cpu"), max_splits=bad)
    for bad in ({"stage": 2}, [("stages", 2)]):
        with pytest.raises(ValueError, match="kernel_options"):
            TritonDecodeBackend(cfg, kv, torch.device("cpu"), kernel_options=bad)
    assert make_backend(cfg, kv, torch.device("cpu")).name == "triton-decode"


def test_config_and_engine_options():
    from graphrt.engine.config import EngineConfig
    assert _config(dtype="bfloat16").backend == "triton-decode"
    assert _config(kv_cache_dtype="fp8").kv_fp8                     # FP8 pages supported
    with pytest.raises(ConfigError, match="float32 runs only on the torch backends and 'triton-decode'"):
        _config(backend="flashinfer")
    assert EngineConfig(backend="triton-decode").backend == "triton-decode"


def test_auto_candidates_and_choice(capsys):
    from capture.build import candidate_backends, pick_backends
    cfg = _config(buckets=[1, 2], max_context_len=64, kv_pool_pages=16, backend="auto")
    assert candidate_backends(cfg, torch.device("cpu")) == ["torch-splitkv"]          # CPU: unchanged
    assert candidate_backends(cfg.replace(dtype="bfloat16"), torch.device("cuda")) == \
        ["flashinfer", "xqa", "triton-decode"]
    assert candidate_backends(cfg.replace(page_size=8, dtype="bfloat16"), torch.device("cuda")) == \
        ["flashinfer", "triton-decode"]
    assert candidate_backends(cfg, torch.device("cuda")) == ["torch-splitkv", "triton-decode"]
    kv = PagedKVCache.allocate(cfg, 16, "cpu")
    choice = pick_backends(cfg, kv, torch.device("cpu"), ["torch-splitkv", "triton-decode"], progress=False)
    assert set(choice) == {1, 2} and set(choice.values()) <= {"torch-splitkv", "triton-decode"}
    assert "skipped" not in capsys.readouterr().out                 # both verified and timed


def test_model_step_matches_hf():
    """ModelRuntime with backend 'triton-decode': decode logits of a ragged batch equal HF's."""
    transformers = pytest.importorskip("transformers")
    from graphrt.model import LlamaDecoder
    from graphrt.model.runtime import ModelRuntime
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=160, hidden_size=256, intermediate_size=224, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, max_position_embeddings=256, tie_word_embeddings=False)).eval()   # G = 4, D = 64
    cfg = RuntimeConfig(num_qo_heads=4, num_kv_heads=1, head_dim=64, page_size=PAGE, max_context_len=160,
                        buckets=[1, 4], dtype="float32", backend="triton-decode", kv_pool_pages=48)
    mrt = ModelRuntime(LlamaDecoder.from_hf(hf), cfg, "cpu", keep_logits=True)
    assert mrt.backend.name == "triton-decode"
    gen = torch.Generator().manual_seed(1)
    lens = [70, 3, 130]                                   # 130 + 4 keys: 3 splits
    prompts = [torch.randint(0, 160, (n,), generator=gen) for n in lens]
    table = torch.randperm(48, generator=gen)[:30].to(torch.int32).view(3, 10)
    mrt.prefill(prompts, table)
    seqs, seq_lens = list(prompts), torch.tensor(lens, dtype=torch.int32)
    for _ in range(4):
        cur = torch.randint(0, 160, (3,), generator=gen)
        seq_lens += 1
        mrt.decode(cur, table, seq_lens)
        seqs = [torch.cat([s, cur[i:i + 1]]) for i, s in enumerate(seqs)]
        with torch.no_grad():
            ref = torch.stack([hf(s[None]).logits[0, -1] for s in seqs])
        torch.testing.assert_close(mrt.last_logits(3), ref, rtol=1e-4, atol=1e-4)
