"""The 'torch' attention backend (a CPU's default): the prepare kernel's torch reference, then
reference_decode; against the 'reference' backend (Triton prepare launch + the same oracle) and
verify_bucket's float32 check, with bad lengths and page ids flagged the same way."""
from __future__ import annotations

import torch

from graphrt.attention.backends import make_backend
from graphrt.attention.buffers import StaticBuffers
from graphrt.attention.kvcache import PagedKVCache
from graphrt.config import RuntimeConfig
from graphrt.kernels.flags import ERR_PAGE_ID, ERR_SEQ_LEN


def _cfg(backend: str) -> RuntimeConfig:
    return RuntimeConfig(num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=16, max_context_len=96,
                         buckets=[4], dtype="float32", backend=backend, kv_pool_pages=30)


def test_equals_the_reference_backend_and_flags_bad_rows():
    gen = torch.Generator().manual_seed(0)
    out, flags, lens = {}, {}, {}
    for name in ("torch", "reference"):
        cfg = _cfg(name)
        kv = PagedKVCache.allocate(cfg, 30, "cpu", seed=3)
        view = StaticBuffers(cfg, torch.device("cpu")).view(4)
        backend = make_backend(cfg, kv, torch.device("cpu"))
        backend.setup([view])
        view.block_table.copy_(torch.randperm(30, generator=torch.Generator().manual_seed(1))[:24]
                               .to(torch.int32).view(4, 6))
        view.block_table[2, 1] = 99                                  # outside the pool: read as page 0
        view.seq_lens.copy_(torch.tensor([37, 0, 20, 500], dtype=torch.int32))   # 500 > max_context_len
        q = torch.randn(4, 4, 64, generator=torch.Generator().manual_seed(2))
        o = torch.empty_like(q)
        backend.prepare(view)
        backend.attend(view, q, kv, o)
        out[name], flags[name], lens[name] = o, int(view.device_error), view.seq_lens.tolist()
    assert backend.name == "reference" and make_backend(_cfg("torch"), kv, torch.device("cpu")).name == "torch"
    torch.testing.assert_close(out["torch"], out["reference"], rtol=1e-6, atol=1e-6)
    assert flags["torch"] == flags["reference"] == ERR_SEQ_LEN | ERR_PAGE_ID
    assert lens["torch"] == lens["reference"] == [37, 0, 20, 0]     # the bad length runs as empty
    assert not out["torch"][1].any() and not out["torch"][3].any()   # empty rows: zeros


def test_a_decode_runtime_on_the_torch_backend_verifies():
    from graphrt.attention.runtime import DecodeRuntime
    from graphrt.attention.verify import verify_bucket
    cfg = _cfg("torch")
    rt = DecodeRuntime(cfg, PagedKVCache.allocate(cfg, 30, "cpu"), "cpu")
    rt.capture()
    assert verify_bucket(rt, 4, lengths=[1, 17, 96, 40]) < 1e-4
