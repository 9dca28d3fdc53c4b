"""Attention backends behind one interface (see base.py); FlashInfer ones import it lazily.

triton-decode is graphrt's own one-launch split-KV decode kernel (CUDA and CPU, FP8 KV too);
torch is the torch path's (a CPU's default: no Triton, no plan); every other backend launches
Triton kernels (the prepare kernel at least): without Triton installed it is TritonMissing."""
from __future__ import annotations

from graphrt.attention.backends.base import AttentionBackend

_TRITON_BACKENDS = ("reference", "flashinfer", "flashinfer-hostplan", "xqa", "torch-splitkv", "triton-decode")


def make_backend(config, kv_cache, device, *, name: str | None = None,
                 parity_sets: int | None = None) -> AttentionBackend:
    """Backend named `name` (default: config.backend). 'auto' must be resolved before this.
    parity_sets: device-planner parity checks per bucket (FlashInfer; default 4)."""
    name = name or config.backend
    if name in _TRITON_BACKENDS:               # they launch graphrt's Triton kernels
        from graphrt.kernels.triton_import import require_triton
        require_triton(f"backend {name!r} (a CPU without Triton runs backend 'torch')")
    if name == "reference":
        from graphrt.attention.backends.reference import ReferenceBackend
        return ReferenceBackend(config, kv_cache, device)
    if name in ("flashinfer", "flashinfer-hostplan"):
        from graphrt.attention.backends.flashinfer import FlashInferBackend
        planner = "host" if name == "flashinfer-hostplan" else config.planner
        extra = {} if parity_sets is None else {"parity_sets": parity_sets}
        return FlashInferBackend(config, kv_cache, device, planner=planner, **extra)
    if name == "torch":
        from graphrt.attention.backends.torch_decode import TorchDecodeBackend
        return TorchDecodeBackend(config, kv_cache, device)
    if name == "torch-splitkv":
        from graphrt.attention.backends.torch_splitkv import TorchSplitKVBackend
        return TorchSplitKVBackend(config, kv_cache, device)
    if name == "triton-decode":
        from graphrt.attention.backends.triton_decode import TritonDecodeBackend
        return TritonDecodeBackend(config, kv_cache, device)
    if name == "xqa":
        from graphrt.attention.backends.xqa import XqaBackend
        return XqaBackend(config, kv_cache, device)
    raise ValueError(f"backend: {name!r} is not one of ['reference', 'torch', 'flashinfer', "
                     f"'flashinfer-hostplan', 'xqa', 'torch-splitkv', 'triton-decode'] ('auto' is resolved by graphrt-capture)")


__all__ = ["AttentionBackend", "make_backend"]
