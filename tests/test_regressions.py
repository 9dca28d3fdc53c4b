"""Regressions for defects found in review (each failed before its fix)."""
from __future__ import annotations

import pytest
import torch

from graphrt import RuntimeConfig
from graphrt.attention.backends import make_backend
from graphrt.attention.backends.base import AttentionBackend
from graphrt.attention.buffers import StaticBuffers
from graphrt.model.context import AttentionContext
from graphrt.kernels import ERR_PAGE_ID
from graphrt.attention.kvcache import PagedKVCache


def test_bad_page_id_does_not_redirect_kv_write_into_page_0():
    cfg = RuntimeConfig(num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=4,
                        max_pages_per_seq=4, buckets=[2], dtype="float32", backend="reference")
    kv = PagedKVCache.allocate(cfg, 8, "cpu")
    view = StaticBuffers(cfg, torch.device("cpu")).view(2)
    backend = make_backend(cfg, kv, torch.device("cpu"))
    backend.setup([view])
    view.block_table.copy_(torch.tensor([[1, 2, 3, 4], [5, 99, 6, 7]], dtype=torch.int32))
    view.seq_lens.copy_(torch.tensor([3, 6], dtype=torch.int32))  # row 1: token 5 -> col 1 = 99
    page0_k = kv.k[0].clone()
    ctx = AttentionContext(backend, view, [kv])
    ctx.prepare()                                   # LlamaDecoder.decode_step's order
    ctx.write_kv(0, torch.randn(2, 2, 64), torch.randn(2, 2, 64))
    assert int(view.device_error) & ERR_PAGE_ID      # the guard does flag the bad id...
    assert torch.equal(kv.k[0], page0_k)             # ...but page 0 must not be written


class _HostPlannedStub(AttentionBackend):
    """Stands in for FlashInferBackend after planner='host' (config) or a parity fallback."""
    name = "host-planned-stub"
    needs_host_inputs = True

    def attend(self, view, q, kv, out):
        out.zero_()


def test_multi_step_refuses_every_host_planned_backend(monkeypatch):
    import graphrt.model.runtime as mr
    from graphrt.model.llama import LlamaSpec

    class _Model:
        spec = LlamaSpec(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1,
                         num_heads=4, num_kv_heads=2, head_dim=64, rms_norm_eps=1e-6,
                         rope_theta=1e4, tie_word_embeddings=True, attention_bias=False)

    cfg = RuntimeConfig(num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=16,
                        max_context_len=64, buckets=[1], dtype="bfloat16", backend="flashinfer",
                        planner="host", kv_pool_pages=8)
    monkeypatch.setattr(mr, "make_backend",
                        lambda config, kv, device, name=None: _HostPlannedStub(config, kv, device))
    with pytest.raises(ValueError, match="steps_per_graph"):
        mr.ModelRuntime(_Model(), cfg, "cpu", steps_per_graph=4)


def test_model_capture_after_prefill_keeps_page_0(monkeypatch):
    transformers = pytest.importorskip("transformers")
    import graphrt.model.runtime as mr
    from graphrt.attention.graphs import CaptureStats, GraphRunner
    from graphrt.model import LlamaDecoder

    class _WarmUpOnly(GraphRunner):  # the graph runner without CUDA: the warm-up runs eagerly
        enabled = property(lambda self: True)

        def _record(self, key, step, prepare):
            for _ in range(self.warmup_steps):
                step()
            return None, CaptureStats(key.bucket, 0.0, 0.0, 0, key)

    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=160, hidden_size=128, intermediate_size=224, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)).eval()
    cfg = RuntimeConfig(num_qo_heads=2, num_kv_heads=1, head_dim=64, page_size=16,
                        max_context_len=128, buckets=[1], dtype="float32",
                        backend="torch-splitkv", kv_pool_pages=16)
    mrt = mr.ModelRuntime(LlamaDecoder.from_hf(hf), cfg, "cpu", steps_per_graph=2)
    table = torch.arange(8, dtype=torch.int32).view(1, 8)        # the request owns pages 0..7
    mrt.prefill([torch.randint(0, 160, (20,))], table)
    before = [c.k[0].clone() for c in mrt.kv_caches]
    mrt.graphs = _WarmUpOnly(mrt.device)
    monkeypatch.setattr(mrt, "device", torch.device("cuda"))      # take capture()'s graph path
    monkeypatch.setattr(mrt.backend, "capturable", True)
    mrt.capture()
    assert all(torch.equal(c.k[0], b) for c, b in zip(mrt.kv_caches, before))


class _PlanRecorder(AttentionBackend):
    """A host-planned backend that records every host plan (stands in for flashinfer-hostplan)."""
    name = "plan-recorder"
    capturable = False
    needs_host_inputs = True

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.plans = []

    def host_prepare(self, view, seq_lens_cpu):
        self.plans.append(seq_lens_cpu.clone())

    def attend(self, view, q, kv, out):
        out.zero_()


def test_host_planned_backend_plans_every_replay_once(monkeypatch):
    import graphrt.attention.runtime as runtime_mod
    from graphrt import DecodeRuntime
    monkeypatch.setattr(runtime_mod, "make_backend",
                        lambda config, kv, device, name=None, parity_sets=None:
                        _PlanRecorder(config, kv, device))
    cfg = RuntimeConfig(num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=16,
                        max_context_len=64, buckets=[2, 4], dtype="float32", backend="reference")
    kv = PagedKVCache.allocate(cfg, 8, "cpu")
    rt = DecodeRuntime(cfg, kv, "cpu")
    rt.capture()
    backend = rt.backend_for(4)
    view = rt.static_inputs(3)                       # zero-copy path: the plan must be fresh
    view.seq_lens.copy_(torch.tensor([5, 17, 40, 0], dtype=torch.int32))
    rt.replay(view)
    assert backend.plans[-1].tolist() == [5, 17, 40, 0]
    n_before = len(backend.plans)
    q = torch.randn(3, 4, 64)
    rt.decode(q, torch.zeros((3, 4), dtype=torch.int32), torch.tensor([1, 2, 3], dtype=torch.int32))
    assert len(backend.plans) == n_before + 1 and backend.plans[-1].tolist() == [1, 2, 3]


def test_cuda_core_empty_rows_before_a_long_row_decode_correctly_on_cpu():
    # on the nominal H200 spec (148-tile CUDA-core grid, 8 kv heads) FlashInfer's plan for
    # 15 idle slots before an 18944-token request drops that request's tiles; the torch split-KV
    # executor over graphrt's device plan ended in an IndexError. It must equal the reference.
    from graphrt import DecodeRuntime
    from graphrt.attention.reference import reference_decode
    cfg = RuntimeConfig(num_qo_heads=8, num_kv_heads=8, head_dim=64, page_size=16,
                        max_pages_per_seq=1184, buckets=[16], dtype="float32",
                        backend="torch-splitkv", decode_kernel="cuda-core")
    kv = PagedKVCache.allocate(cfg, 1200, "cpu", seed=3)
    rt = DecodeRuntime(cfg, kv, "cpu")
    gen = torch.Generator().manual_seed(0)
    lens = torch.tensor([0] * 15 + [18944], dtype=torch.int32)
    table = torch.randperm(1200, generator=gen)[:16 * 1184].reshape(1, -1).repeat(16, 1)[:, :1184]
    table = table.to(torch.int32).contiguous()
    q = torch.randn(16, 8, 64, generator=gen)
    out = rt.decode(q, table, lens).clone()
    rt.check_device_errors()
    ref = reference_decode(q, kv.k, kv.v, table, lens, layout=cfg.kv_layout)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_graph_warmup_runs_name_the_variable():
    from graphrt.attention.graphs import GraphRunner
    from graphrt.model.options import env_overrides
    assert env_overrides({"GRAPHRT_GRAPH_WARMUP": "1"}) == {"graph_warmup": 1}
    assert GraphRunner("cpu", warmup_steps=3).warmup_steps == 3
    for bad in ("0", "-1", "two"):
        with pytest.raises(ValueError, match="GRAPHRT_GRAPH_WARMUP: expected an int >= 1"):
            env_overrides({"GRAPHRT_GRAPH_WARMUP": bad})
    for bad in (0, -1, "2", True):
        with pytest.raises(ValueError, match="warmup_steps: must be an int >= 1"):
            GraphRunner("cpu", warmup_steps=bad)
