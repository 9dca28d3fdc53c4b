"""Pure-torch reference backend (float32 accumulation): the oracle, on CPU and GPU. Eager only."""
from __future__ import annotations

from ..buffers import BucketView
from ..reference import reference_decode
from .base import AttentionBackend


class ReferenceBackend(AttentionBackend):
    name = "reference"
    capturable = False  # reads seq_lens on the host to size its gather

    def run(self, view: BucketView) -> None:
        k, v = self.kv_cache.as_tuple()
        out = reference_decode(view.query, k, v, view.block_table, view.seq_lens,
                               layout=self.config.kv_layout, sm_scale=self.sm_scale)
        view.output.copy_(out)
