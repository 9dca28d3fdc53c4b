"""kernels/transfer.py: host-to-device copies without a host sync. CPU: values, dtypes and the
pass-through; GPU: the copy makes no synchronising call (sync-debug mode "error") and the data
arrives intact behind queued work, even when the caller overwrites its tensor at once."""
from __future__ import annotations

import pytest
import torch

from graphrt.kernels.transfer import tensor_on, to_device


def test_cpu_pass_through_and_values():
    t = torch.arange(7, dtype=torch.int32)
    assert to_device(t, "cpu") is t
    u = tensor_on([3, 1, 2], torch.long, "cpu")
    assert u.dtype == torch.int64 and u.tolist() == [3, 1, 2]
    assert tensor_on([], torch.int32, "cpu").numel() == 0
    assert tensor_on([1.5], torch.float32, torch.device("cpu")).item() == 1.5


@pytest.mark.gpu
def test_gpu_copy_makes_no_sync_and_lands_behind_queued_work():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    a = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    for _ in range(8):
        a = a @ a.T / 64                       # queued work: the copies must not wait for it
    host = torch.arange(1000, dtype=torch.int32)
    torch.cuda.set_sync_debug_mode("error")
    try:
        dev = to_device(host, "cuda")
        idx = tensor_on(list(range(5)), torch.long, "cuda")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    host.fill_(-1)                             # the caller reuses its tensor at once
    assert dev.device.type == "cuda" and dev.dtype == torch.int32
    assert dev.cpu().tolist() == list(range(1000)) and idx.cpu().tolist() == list(range(5))
