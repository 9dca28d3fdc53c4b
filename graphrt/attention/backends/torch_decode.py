"""The torch path's decode attention (a CPU's default backend): no Triton, no plan. Eager only.

prepare: the prepare kernel's torch reference (kernels/reference.py `prepare_metadata`: bad
seq_lens rewritten to 0, the sanitised block table, device-error flags); attend:
`reference_decode` over the sanitised table, float32 accumulation, rows batched (no Python loop
over requests or tiles).
"""
from __future__ import annotations

from graphrt.attention.backends.base import AttentionBackend
from graphrt.attention.buffers import BucketView
from graphrt.attention.reference import reference_decode
from graphrt.kernels.reference import prepare_metadata


class TorchDecodeBackend(AttentionBackend):
    name = "torch"
    capturable = False  # reference_decode reads seq_lens on the host to size its gather
    reads_block_table = True

    def setup(self, views: list[BucketView]) -> None:
        """Nothing to set up per bucket (no launch, no plan)."""

    def prepare(self, view: BucketView) -> None:
        c = self.config
        prepare_metadata(view, page_size=c.page_size, max_context_len=c.max_context_len,
                         num_pool_pages=self.kv_cache.num_pages, checked_table=True)

    def attend(self, view: BucketView, q, kv, out) -> None:
        k, v = kv.as_tuple()
        k_scale, v_scale = kv.kv_scales()              # FP8 pages: dequantized in float32
        out.copy_(reference_decode(q, k, v, view.block_table_checked, view.seq_lens,
                                   layout=self.config.kv_layout, sm_scale=self.sm_scale,
                                   k_scale=k_scale, v_scale=v_scale))

    def describe(self, size: int) -> dict:
        return {"backend": self.name, "planner": "none (torch, eager)"}
