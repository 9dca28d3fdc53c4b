"""Pure-torch reference backend (float32 accumulation): the oracle, on CPU and GPU. Eager only."""
from __future__ import annotations

from graphrt.attention.buffers import BucketView
from graphrt.attention.reference import reference_decode
from graphrt.attention.backends.base import AttentionBackend


class ReferenceBackend(AttentionBackend):
    name = "reference"
    capturable = False  # reads seq_lens on the host to size its gather
    reads_block_table = True

    def attend(self, view: BucketView, q, kv, out) -> None:
        k, v = kv.as_tuple()
        k_scale, v_scale = kv.kv_scales()              # FP8 pages: dequantized in float32
        out.copy_(reference_decode(q, k, v, view.block_table_checked, view.seq_lens,
                                   layout=self.config.kv_layout, sm_scale=self.sm_scale,
                                   k_scale=k_scale, v_scale=v_scale))
