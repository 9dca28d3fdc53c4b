"""torch-splitkv backend: its int workspace can always be viewed as int32 by the prepare kernel."""
from __future__ import annotations

import pytest
import torch

from graphrt import DecodeRuntime, PagedKVCache, RuntimeConfig
from graphrt.attention import flashinfer_layout as fl
from graphrt.attention.backends.torch_splitkv import int_workspace_nbytes
from graphrt.attention.verify import verify_bucket


@pytest.mark.parametrize("kind", [fl.TENSOR_CORE, fl.CUDA_CORE])
@pytest.mark.parametrize("num_kv_heads", [1, 2, 4, 8])
def test_int_workspace_size_is_16_byte_aligned_and_holds_the_plan(kind, num_kv_heads):
    odd = 0
    for bs in range(1, 300):
        spec = fl.nominal_spec(kind, bs, 16, num_kv_heads)
        n = int_workspace_nbytes(spec)
        assert n % 16 == 0 and spec.int_workspace_bytes <= n < spec.int_workspace_bytes + 16
        odd += spec.int_workspace_bytes % 4 != 0
    if kind == fl.TENSOR_CORE and num_kv_heads == 8:
        assert odd  # the layouts that used to break `view(torch.int32)` are among these


def test_llama_8b_geometry_bucket_1_runs():
    """Llama-3.1-8B attention geometry: bucket 1's plan uses 513 bytes (not a multiple of 4)."""
    cfg = RuntimeConfig(num_qo_heads=32, num_kv_heads=8, head_dim=128, page_size=16,
                        max_context_len=256, buckets=[1, 2], dtype="bfloat16",
                        backend="torch-splitkv", kv_pool_pages=64)
    assert fl.nominal_spec(cfg.decode_kernel, 1, 16, 8).int_workspace_bytes % 4 != 0
    rt = DecodeRuntime(cfg, PagedKVCache.allocate(cfg, 64, "cpu"), "cpu")
    rt.capture()
    assert verify_bucket(rt, 1, lengths=[200]) < 2e-2 and verify_bucket(rt, 2) < 2e-2
    assert rt.backend.int_workspace[1].numel() % 16 == 0
