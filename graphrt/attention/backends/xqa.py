"""FlashInfer's plan-free XQA decode (`trtllm_batch_decode_with_kv_cache(backend="xqa")`, Hopper).

Reads the bucket's seq_lens and block table directly; the grid depends only on static shapes, so
the graph needs no plan. The prepare launch still runs first: the input guard (bad seq_lens
rewritten to 0 in place) and a sanitised copy of the used block-table columns
(view.block_table_checked, bad page ids read as page 0), which is what XQA reads.
"""
from __future__ import annotations

import torch

from graphrt.attention.buffers import BucketView
from graphrt.attention.flashinfer_import import import_flashinfer
from graphrt.attention.backends.base import AttentionBackend

XQA_WORKSPACE_MB = 128  # the first 8 MB are semaphores: zeroed once at allocation


class XqaBackend(AttentionBackend):
    name = "xqa"
    capturable = True
    reads_block_table = True

    def __init__(self, config, kv_cache, device):
        super().__init__(config, kv_cache, device)
        if device.type != "cuda":
            raise RuntimeError(f"backend 'xqa' runs on CUDA (Hopper) only, not on {device}")
        if config.kv_fp8:
            raise ValueError("kv_cache_dtype: 'fp8' is not supported by backend 'xqa'; use 'flashinfer'")
        decode = import_flashinfer("backend 'xqa'", "flashinfer.decode")   # lazy: CUDA only
        self._decode = decode.trtllm_batch_decode_with_kv_cache
        self.workspace = torch.zeros(XQA_WORKSPACE_MB << 20, dtype=torch.uint8, device=device)

    def attend(self, view: BucketView, q, kv, out) -> None:
        self._decode(q, kv.as_tuple(), self.workspace, view.block_table_checked, view.seq_lens,
                     self.config.max_context_len, bmm1_scale=self.sm_scale, bmm2_scale=1.0,
                     out=out, kv_layout=self.config.kv_layout, backend="xqa")
