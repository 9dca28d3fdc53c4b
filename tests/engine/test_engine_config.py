"""EngineConfig (graphrt/engine/config.py): every field type- and range-checked, naming the field;
the big buffers a config implies checked against the memory of their device before anything is
allocated (a ValueError with the bytes needed, the bytes available and the fields)."""
from __future__ import annotations

import pytest

from _checkpoints import write
from graphrt.engine.config import EngineConfig
from graphrt.model.spec import LlamaSpec

TINY = LlamaSpec(vocab_size=384, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=2,
                 num_kv_heads=1, head_dim=64, rms_norm_eps=1e-5, rope_theta=1e4,
                 tie_word_embeddings=False, attention_bias=False, max_position_embeddings=256)


@pytest.mark.parametrize("field,value", [
    ("seed", -1), ("seed", "x"), ("seed", 2**63), ("seed", True), ("seed", 1.5),
    ("max_batch", 0), ("max_batch", 2**31), ("max_batch", 4.0), ("max_batch", None),
    ("steps_per_graph", -2), ("steps_per_graph", "4"), ("steps_per_graph", 0), ("steps_per_graph", -1),
    ("steps_per_graph", "fast"), ("steps_per_graph", True), ("steps_per_graph", 2.5), ("steps_per_graph", None),
    ("max_prefill_stall", "fast"), ("max_prefill_stall", 0), ("page_size", 2**40), ("page_size", False),
    ("num_pages", 0), ("num_pages", 2**31), ("max_model_len", "8k"), ("max_model_len", 0),
    ("gpu_memory_utilization", 0), ("gpu_memory_utilization", 1.5), ("gpu_memory_utilization", "0.9"),
    ("gpu_memory_utilization", float("nan")),
    ("backend", "fast"), ("backend", "auto"), ("backend", ["flashinfer"]), ("backend", 3),
    ("dtype", "fp8"), ("dtype", ["bfloat16"]), ("dtype", 16),
    ("overlap", 1), ("overlap", "yes"), ("capture", None),
    ("prefill_graph_tokens", -1), ("prefill_graph_tokens", True), ("prefill_graph_tokens", 9000),
    ("prefill_graph_tokens", "512"), ("kernels", "cuda"), ("kernels", 1), ("kernels", ["torch"]),
])
def test_every_field_is_checked(field, value):
    with pytest.raises(ValueError, match=f"^{field}: "):
        EngineConfig(**{field: value})


@pytest.mark.parametrize("field,value", [("seed", 0), ("seed", 2**63 - 1), ("seed", None),
                                         ("num_pages", None), ("max_model_len", None),
                                         ("gpu_memory_utilization", 1), ("backend", "reference"),
                                         ("dtype", "float32"), ("page_size", 1),
                                         ("prefill_graph_tokens", 0), ("prefill_graph_tokens", 8192),
                                         ("steps_per_graph", "auto"), ("steps_per_graph", 1),
                                         ("max_prefill_stall", "auto"), ("max_prefill_stall", None),
                                         ("kernels", None), ("kernels", "torch"), ("kernels", "triton"),
                                         ("kernels", "auto")])
def test_edge_values_are_accepted(field, value):
    assert getattr(EngineConfig(**{field: value}), field) == value


@pytest.mark.parametrize("fields", [{"page_size": 10**6}, {"max_batch": 10**5}])
def test_memory_needed_counts_the_pool_and_the_tables(fields):
    cfg = EngineConfig(**fields)
    pages = 1 + cfg.max_batch * cfg.pages_per_seq(256)
    need = cfg.memory_needed(TINY, max_model_len=256, dtype_bytes=4, pool_pages=pages)
    page_bytes = 2 * 2 * cfg.page_size * 1 * 64 * 4           # K and V, 2 layers, 1 KV head, D 64, float32
    assert need["kv_pool"] == pages * page_bytes > 16 * 2**30          # what the CPU used to allocate
    assert need["block_tables"] == 3 * cfg.max_batch * cfg.pages_per_seq(256) * 4
    with pytest.raises(ValueError) as e:
        cfg.check_memory(need, available_bytes=8 * 2**30, device="cpu")
    msg = str(e.value)
    total = sum(need.values())
    assert f"needs {total} bytes" in msg and f"{8 * 2**30} bytes" in msg and "on cpu" in msg
    for k, v in fields.items():
        assert f"{k}={v}" in msg
    cfg.check_memory(need, available_bytes=total, device="cpu")        # exactly enough: fine


def test_cpu_pool_is_a_share_of_available_memory():
    """A CPU's default pool: CPU_KV_FRACTION of the available memory, at most CPU_KV_MAX_BYTES,
    at least one sequence of max_model_len, at most every slot at max_model_len."""
    from graphrt.engine.config import CPU_KV_FRACTION, CPU_KV_MAX_BYTES
    cfg = EngineConfig(max_batch=16)
    page_bytes = 2 * 2 * cfg.page_size * 1 * 64 * 4
    per_seq = cfg.pages_per_seq(256)
    pages = lambda avail: cfg.cpu_pool_pages(TINY, max_model_len=256, dtype_bytes=4, available_bytes=avail)
    avail = 200 * page_bytes / CPU_KV_FRACTION                      # room for 200 pages
    assert pages(avail) == 199                                      # - the null page
    assert pages(1024) == per_seq                                   # tiny host: one sequence (checked later)
    assert pages(10**15) == min(16 * per_seq, CPU_KV_MAX_BYTES // page_bytes - 1)
    assert (pages(10**15) + 1) * page_bytes <= max(CPU_KV_MAX_BYTES, (16 * per_seq + 1) * page_bytes)


def test_cpu_defaults_for_a_135m_model():
    """SmolLM2-135M's geometry on a 16 GiB host: a pool of at most 1 GiB, not 5.6 GiB."""
    spec = LlamaSpec(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                     num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5, rope_theta=1e5, tie_word_embeddings=True,
                     attention_bias=False, max_position_embeddings=8192)
    cfg = EngineConfig()
    max_len = cfg.resolve_max_model_len(spec.max_position_embeddings)
    pages = cfg.cpu_pool_pages(spec, max_model_len=max_len, dtype_bytes=4, available_bytes=16 * 2**30)
    need = cfg.memory_needed(spec, max_model_len=max_len, dtype_bytes=4, pool_pages=1 + pages)
    assert need["kv_pool"] <= 2**30 and pages >= cfg.pages_per_seq(max_len)
    full = cfg.memory_needed(spec, max_model_len=max_len, dtype_bytes=4,
                             pool_pages=1 + cfg.max_batch * cfg.pages_per_seq(max_len))
    assert full["kv_pool"] > 5 * 2**30                               # what every slot at 8k would take
    assert cfg.runtime_config(spec, device_type="cpu", dtype="float32", max_model_len=max_len,
                              num_pages=pages).backend == "torch"   # the CPU's attention backend


def test_reserve_counts_each_slots_processing_rows():
    """Per slot beside the pool: the decode logits with the sort (2 x 16 bytes a token id) and
    the logits-processing rows (int32 counts, bool prompt mask, float32 rule scratch: 9 bytes)."""
    one, two = EngineConfig(max_batch=1), EngineConfig(max_batch=2)
    per_slot = two.reserve_bytes(TINY, dtype_bytes=4) - one.reserve_bytes(TINY, dtype_bytes=4)
    assert per_slot == TINY.vocab_size * (2 * 16 + 9)


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


@pytest.mark.parametrize("fields", [{"page_size": 10**6, "num_pages": 16}, {"max_batch": 10**5, "num_pages": 10**6}])
def test_llm_refuses_an_oversized_pool_before_allocating_it(tmp_path_factory, monkeypatch, fields):
    pytest.importorskip("transformers")
    import graphrt.engine.llm as llm_mod
    from graphrt import LLM
    path = write(tmp_path_factory, "bounds", arch="llama", dtype="float32", seed=2)
    monkeypatch.setattr(llm_mod, "available_bytes", lambda device: 8 * 2**30)   # a machine of 8 GiB free
    before = _rss()
    with pytest.raises(ValueError, match=r"the runtime needs \d+ bytes .* on cpu, 8589934592 bytes"):
        LLM(path, device="cpu", backend="reference", **fields)
    assert _rss() - before < 2**30                                  # nothing of the 16+ GiB was touched
