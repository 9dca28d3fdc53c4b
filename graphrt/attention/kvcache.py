"""The paged KV cache graphrt reads: two tensors, K and V, in FlashInfer's NHD or HND layout."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from graphrt.config import RuntimeConfig


@dataclass(frozen=True)
class PagedKVCache:
    """K and V pages of one attention layer.

    k, v: [num_pages, page_size, num_kv_heads, head_dim] (NHD) or
          [num_pages, num_kv_heads, page_size, head_dim] (HND); dtype = config dtype; same device.
    """

    k: torch.Tensor
    v: torch.Tensor
    layout: str = "NHD"

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
        """Random (not zero) pages: zeros hide indexing bugs."""
        shape = expected_shape(config, num_pages)
        device = torch.device(device)
        gen = torch.Generator(device=device).manual_seed(config.seed if seed is None else seed)
        k = torch.randn(shape, generator=gen, device=device, dtype=config.torch_dtype)
        v = torch.randn(shape, generator=gen, device=device, dtype=config.torch_dtype)
        return cls(k, v, config.kv_layout)

    def check(self, config: RuntimeConfig, device: torch.device) -> None:
        """Raise ValueError naming the field when this cache does not match `config` / `device`."""
        want = expected_shape(config, self.num_pages)
        for name, t in (("kv_cache.k", self.k), ("kv_cache.v", self.v)):
            if tuple(t.shape) != want:
                raise ValueError(f"{name}: shape {tuple(t.shape)} does not match config "
                                 f"({config.kv_layout}) {want}")
            if t.dtype != config.torch_dtype:
                raise ValueError(f"{name}: dtype {t.dtype}, config dtype is {config.torch_dtype}")
            if t.device != device:
                raise ValueError(f"{name}: on {t.device}, runtime device is {device}")
        if self.layout != config.kv_layout:
            raise ValueError(f"kv_cache.layout: {self.layout}, config kv_layout is {config.kv_layout}")


def expected_shape(config: RuntimeConfig, num_pages: int) -> tuple[int, int, int, int]:
    if config.kv_layout == "NHD":
        return (num_pages, config.page_size, config.num_kv_heads, config.head_dim)
    return (num_pages, config.num_kv_heads, config.page_size, config.head_dim)
