"""The paged KV cache graphrt reads: two tensors, K and V, in FlashInfer's NHD or HND layout.

FP8 (config.kv_cache_dtype="fp8"): K and V are float8_e4m3fn pages (one byte per value: twice
the tokens of a bf16 pool in the same bytes) with one per-tensor k and one v scale per layer,
`scale` ([2] float32 on the cache's device: a stored e means e * scale). Every writer (the
append kernels) stores clamp(x / scale, +-448) and every reader (attention backends, verify and
prefill attention) multiplies back. The scale tensor is updated in place only (graphs captured
over it read the new value), and only before any page is written with it
(graphrt/model/quant/kv.py: where scales come from).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from graphrt.config import RuntimeConfig


FILL_PERIOD = 1_000_003       # elements of the random block a fresh pool repeats (a prime)


def _random_fill(t: torch.Tensor, gen: torch.Generator, draw_dtype: torch.dtype) -> torch.Tensor:
    """t (any shape, any KV dtype) filled with a standard-normal block of FILL_PERIOD elements
    drawn in draw_dtype (the model dtype) and repeated along t's flat order; returns t."""
    flat = t.view(-1)
    n = flat.numel()
    block = torch.randn(min(n, FILL_PERIOD), generator=gen, device=t.device, dtype=draw_dtype).to(t.dtype)
    for start in range(0, n, block.numel()):
        m = min(block.numel(), n - start)
        flat[start:start + m].copy_(block[:m])
    return t


@dataclass(frozen=True)
class PagedKVCache:
    """K and V pages of one attention layer.

    k, v: [num_pages, page_size, num_kv_heads, head_dim] (NHD) or
          [num_pages, num_kv_heads, page_size, head_dim] (HND); dtype = config.kv_torch_dtype
          (the model dtype, or float8_e4m3fn); same device.
    scale: [2] float32 (k scale, v scale) on that device, exactly when k, v are float8_e4m3fn.
    """

    k: torch.Tensor
    v: torch.Tensor
    layout: str = "NHD"
    scale: torch.Tensor | None = None

    def __post_init__(self) -> None:
        fp8 = self.k.dtype == torch.float8_e4m3fn
        if fp8 != (self.scale is not None):
            raise ValueError(f"scale: a [2] float32 (k, v) scale is required exactly for float8_e4m3fn "
                             f"pages (pages are {self.k.dtype}, scale {'given' if self.scale is not None else 'None'})")
        if fp8 and (self.scale.dtype != torch.float32 or tuple(self.scale.shape) != (2,)
                    or self.scale.device != self.k.device):
            raise ValueError(f"scale: expected [2] float32 on {self.k.device}, got "
                             f"{tuple(self.scale.shape)} {self.scale.dtype} on {self.scale.device}")

    @property
    def fp8(self) -> bool:
        return self.scale is not None

    def kv_scales(self) -> tuple:
        """(k_scale, v_scale) to multiply read values by: 0-d float32 device tensors for FP8 pages
        (no host read: usable inside a graph), else (1.0, 1.0)."""
        return (self.scale[0], self.scale[1]) if self.scale is not None else (1.0, 1.0)

    @property
    def num_pages(self) -> int:
        return self.k.shape[0]

    @property
    def device(self) -> torch.device:
        return self.k.device

    def as_tuple(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k, self.v

    @classmethod
    def allocate(cls, config: RuntimeConfig, num_pages: int, device, *, seed: int | None = None):
        """Random (not zero) pages: zeros hide indexing bugs. Finite values (a masked key's value
        still meets a zero weight in P @ V), drawn once for a block of FILL_PERIOD elements and
        repeated: a prime period, so no two pages (or heads) hold the same values, at the cost of
        writing the pool instead of drawing every element (1 GiB: ~0.3 s on a CPU against ~2 s)."""
        shape = expected_shape(config, num_pages)
        device = torch.device(device)
        gen = torch.Generator(device=device).manual_seed(config.seed if seed is None else seed)
        k, v = (_random_fill(torch.empty(shape, device=device, dtype=config.kv_torch_dtype), gen, config.torch_dtype)
                for _ in range(2))
        scale = torch.ones(2, dtype=torch.float32, device=device) if config.kv_fp8 else None
        return cls(k, v, config.kv_layout, scale)

    def check(self, config: RuntimeConfig, device: torch.device) -> None:
        """Raise ValueError naming the field when this cache does not match `config` / `device`."""
        want = expected_shape(config, self.num_pages)
        for name, t in (("kv_cache.k", self.k), ("kv_cache.v", self.v)):
            if tuple(t.shape) != want:
                raise ValueError(f"{name}: shape {tuple(t.shape)} does not match config "
                                 f"({config.kv_layout}) {want}")
            if t.dtype != config.kv_torch_dtype:
                raise ValueError(f"{name}: dtype {t.dtype}, config's KV dtype is {config.kv_torch_dtype} "
                                 f"(kv_cache_dtype={config.kv_cache_dtype!r})")
            if t.device != device:
                raise ValueError(f"{name}: on {t.device}, runtime device is {device}")
        if self.layout != config.kv_layout:
            raise ValueError(f"kv_cache.layout: {self.layout}, config kv_layout is {config.kv_layout}")


def expected_shape(config: RuntimeConfig, num_pages: int) -> tuple[int, int, int, int]:
    if config.kv_layout == "NHD":
        return (num_pages, config.page_size, config.num_kv_heads, config.head_dim)
    return (num_pages, config.num_kv_heads, config.page_size, config.head_dim)
