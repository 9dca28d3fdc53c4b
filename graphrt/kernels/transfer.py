"""Host-to-device copies that do not synchronise the host with the device.

A plain `cpu_tensor.to("cuda")` (or `torch.tensor(data, device="cuda")`) copies from pageable
memory and then waits for the stream: the host stalls until everything queued before it (a
decode block in flight) has run. `to_device` stages the tensor in pinned memory (a block of
torch's caching host allocator) and copies it non-blocking on the current stream instead; the
allocator keeps the pinned stage until that copy has run, so the caller may drop or reuse its
own tensor at once.

    dev = to_device(torch.arange(n, dtype=torch.int32), device)   # [n] int32 on device, no sync
    idx = tensor_on(slots, torch.long, device)                      # from a list of ints
    copy_into(buffers.ints, host_ints)                              # into a persistent buffer
"""
from __future__ import annotations

import torch


def to_device(t: torch.Tensor, device) -> torch.Tensor:
    """t on `device` (same dtype and shape): a CPU tensor bound for a CUDA device goes through
    pinned memory, copied non-blocking on the current stream (no host sync); any other case is
    `t.to(device)` (the tensor itself when it is already there)."""
    device = torch.device(device)
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    # a fresh pinned block from torch's caching host allocator, filled by copy_: t.pin_memory()
    # would first ask whether t is pinned (is_pinned: ~265 us a call under the H200 profiler)
    stage = torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t)
    return stage.to(device, non_blocking=True)


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """dst.copy_(src) where dst is a device buffer (e.g. a graph's input) and src a CPU tensor of
    its shape: staged in a fresh pinned block and copied non-blocking (no host sync); src may be
    reused at once. Any other pair of devices: a plain copy_. Returns dst."""
    if dst.device.type != "cuda" or src.device.type != "cpu":
        return dst.copy_(src)
    stage = torch.empty(src.shape, dtype=src.dtype, pin_memory=True).copy_(src)
    return dst.copy_(stage, non_blocking=True)


def tensor_on(data, dtype: torch.dtype, device) -> torch.Tensor:
    """torch.as_tensor(data, dtype) on `device` through `to_device` (no host sync on CUDA)."""
    return to_device(torch.as_tensor(data, dtype=dtype), device)


__all__ = ["to_device", "tensor_on", "copy_into"]
