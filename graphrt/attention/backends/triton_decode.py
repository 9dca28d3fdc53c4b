"""graphrt's own decode kernel (kernels/decode_attention.py): split-KV and merge in one launch.

Plan-free like xqa: the prepare launch only guards the inputs (bad seq_lens rewritten to 0 in
place) and writes the sanitised block table (view.block_table_checked), which the kernel reads
with the guarded seq_lens. Each bucket gets a static MAX_SPLITS chosen at setup from the GPU's
SM count and the bucket's batch size (about two waves of programs; a nominal H200's 132 SMs on
a CPU, so the interpreter runs the same split structure); rows then split by their own length on
the device. One persistent DecodeScratch (partials, log-sum-exps, zeroed counters), sized for the
largest need over the buckets, is shared by every layer and bucket (one stream). Runs on CUDA
(captured) and on CPU (eager, TRITON_INTERPRET=1); bf16 / fp16 / float32 and FP8 KV pages.
"""
from __future__ import annotations

from graphrt.attention.buffers import BucketView
from graphrt.attention.backends.base import AttentionBackend
from graphrt.kernels.decode_attention import DecodeScratch, decode_attention, default_max_splits, device_sms


class TritonDecodeBackend(AttentionBackend):
    name = "triton-decode"
    capturable = True
    reads_block_table = True

    def __init__(self, config, kv_cache, device, *, max_splits: dict[int, int] | None = None,
                 kernel_options: dict | None = None):
        """max_splits: {bucket: MAX_SPLITS} to override the default per bucket (benchmarks, tests);
        kernel_options: extra `decode_attention` arguments (block_n, stages, fp8_dot: benchmarks)."""
        if kernel_options is not None and (not isinstance(kernel_options, dict)
                                           or set(kernel_options) - {"block_n", "stages", "fp8_dot"}):
            raise ValueError(f"kernel_options: expected a dict of block_n / stages / fp8_dot, got {kernel_options!r}")
        self._options = dict(kernel_options or {})
        super().__init__(config, kv_cache, device)
        if max_splits is not None and (not isinstance(max_splits, dict) or any(
                isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in max_splits.values())):
            raise ValueError(f"max_splits: expected {{bucket: int >= 1}}, got {max_splits!r}")
        self._override = dict(max_splits or {})
        self.sms = device_sms(device)
        self.max_splits: dict[int, int] = {}
        self.scratch: DecodeScratch | None = None

    def setup(self, views: list[BucketView]) -> None:
        super().setup(views)
        c = self.config
        for view in views:
            self.max_splits[view.size] = self._override.get(view.size) or default_max_splits(
                self.sms, view.size, c.num_kv_heads, c.max_context_len)
        self.scratch = DecodeScratch.allocate(self.max_splits.items(), num_kv_heads=c.num_kv_heads,
                                              group=c.group_size, head_dim=c.head_dim, device=self.device)

    def attend(self, view: BucketView, q, kv, out) -> None:
        decode_attention(q, kv, view.block_table_checked, view.seq_lens,
                         max_splits=self.max_splits[view.size], scratch=self.scratch, out=out,
                         **self._options)

    def describe(self, size: int) -> dict:
        return {"backend": self.name, "planner": "none (splits by length on the device)",
                "max_splits": self.max_splits.get(size)}
