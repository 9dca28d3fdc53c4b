"""ModelRuntime.decode_slots (the engine's path: the graphs read the slot state the input batch
wrote, no copy) against the public decode: the same tokens and K/V, with slots past n holding
other requests' rows; the slots advance on the device by K; on a GPU with captured graphs too
(-m gpu)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from graphrt import RuntimeConfig
from graphrt.model import LlamaDecoder
from graphrt.model.runtime import ModelRuntime
from graphrt.model.sampling import SamplingInputs

transformers = pytest.importorskip("transformers")


def _pair(device, k=2):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=160, hidden_size=128, intermediate_size=224, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                                   tie_word_embeddings=False)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    rc = RuntimeConfig(num_qo_heads=2, num_kv_heads=1, head_dim=64, page_size=16, max_context_len=128,
                       buckets=[1, 2, 4, 8], dtype="float32" if device == "cpu" else "bfloat16",
                       backend="torch" if device == "cpu" else "flashinfer", kv_pool_pages=40)
    # splitk=1: "auto" measures split-K per runtime on a GPU, and two runtimes that chose
    # differently would sum the o / down GEMMs in another order (bf16 K/V unequal, tokens equal)
    return [ModelRuntime(LlamaDecoder.from_hf(hf, dtype=dtype, device=device), rc, device, steps_per_graph=k,
                         sampling=True, splitk=1) for _ in range(2)]


def _check(device):
    from graphrt.worker.input_batch import InputBatch
    public, slotted = _pair(device)
    for rt in (public, slotted):
        rt.capture()
    gen = torch.Generator().manual_seed(1)
    n, b = 2, 5                                        # 2 rows served, 5 rows in the persistent batch
    lens = [9, 33]
    table = torch.randperm(39, generator=gen)[:b * 6].add(1).to(torch.int32).view(b, 6)
    prompts = [torch.randint(0, 160, (x - 1,), generator=gen) for x in lens]
    for rt in (public, slotted):
        rt.prefill(prompts, table[:n])
    cur = torch.randint(0, 160, (b,), generator=gen)
    seq = torch.tensor(lens + [50, 0, 7], dtype=torch.int32)          # rows >= n: not served
    samp = SamplingInputs(torch.tensor([0.0, 0.8]), torch.tensor([0, 5], dtype=torch.int32),
                          torch.tensor([1.0, 0.9]), torch.tensor([1, 2]), torch.zeros(2, dtype=torch.int32))
    batch = InputBatch(max_batch=8, max_pages_per_seq=slotted.config.max_pages_per_seq,
                       pin=device == "cuda")
    for r in range(n):                                 # what the engine's admission writes
        batch.set_pages(r, 0, table[r].tolist())
        batch.activate(r, seq_len=lens[r], step=0, temperature=float(samp.temperature[r]),
                       top_k=int(samp.top_k[r]), top_p=float(samp.top_p[r]), seed=int(samp.seed[r]))
    batch.flush(slotted.slots.apply)
    slotted.slots.tokens[:n].copy_(cur[:n])
    for step, sampled in enumerate((False, True, True)):
        sampling = samp if sampled else None
        if sampled:
            sampling = dataclasses.replace(samp, step=torch.full((2,), (step - 1) * public.k, dtype=torch.int32))
        want = public.decode(cur[:n].clone(), table[:n], seq[:n], sampling=sampling).clone()
        got = slotted.decode_slots(n, sampled=sampled).clone()
        assert torch.equal(got.cpu(), want.cpu())
        seq[:n] += public.k
        cur[:n] = want[-1].cpu()
        assert slotted.slots.seq_lens[:n].tolist() == seq[:n].tolist()      # advanced on the device
        assert slotted.slots.tokens[:n].tolist() == cur[:n].tolist()
    # the served rows' pages (page 0 is the capture's scratch page: what a warm-up writes there,
    # from buffers it has not filled, is nobody's K/V and may differ between the two runtimes)
    pages = table[:n].flatten().to(public.kv_caches[0].k.device)
    for a, b_ in zip(public.kv_caches, slotted.kv_caches):
        assert torch.equal(a.k[pages], b_.k[pages]) and torch.equal(a.v[pages], b_.v[pages])
    slotted.check_device_errors()


def test_trusted_decode_matches_the_public_decode_on_cpu():
    _check("cpu")


@pytest.mark.gpu
def test_trusted_decode_matches_the_public_decode_in_graphs():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _check("cuda")


def test_host_planning_fallback_runs_one_step_per_graph_when_allowed(monkeypatch):
    import graphrt.model.runtime as runtime_mod
    real = runtime_mod.make_backend

    def host_planned(*a, **kw):                       # what a FlashInfer version the planner does not know gives
        backend = real(*a, **kw)
        backend.needs_host_inputs = True
        backend.fallback_reason = "FlashInfer 9.9: unknown plan layout"
        return backend
    monkeypatch.setattr(runtime_mod, "make_backend", host_planned)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=160, hidden_size=128, intermediate_size=224, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)
    model = LlamaDecoder.from_hf(transformers.LlamaForCausalLM(cfg).eval())
    rc = RuntimeConfig(num_qo_heads=2, num_kv_heads=1, head_dim=64, page_size=16, max_context_len=64,
                       buckets=[1, 2], dtype="float32", backend="torch", kv_pool_pages=8)
    with pytest.raises(ValueError, match="steps_per_graph"):
        ModelRuntime(model, rc, "cpu", steps_per_graph=4)
    with pytest.warns(UserWarning, match="unknown plan layout"):
        mrt = ModelRuntime(model, rc, "cpu", steps_per_graph=4, fallback_to_one_step=True)
    assert mrt.k == 1
    with pytest.raises(ValueError, match="fallback_to_one_step: expected a bool"):
        ModelRuntime(model, rc, "cpu", fallback_to_one_step="yes")
