"""The attention runtime: paged-KV decode attention with device-side metadata and planning.

Entry points: `DecodeRuntime` (runtime.py: capture + replay per bucket), `PagedKVCache` (kvcache.py),
`make_backend` (backends/), `pick_bucket` (buckets.py); the FlashInfer plan layout lives in
flashinfer_layout.py alone. Imports only `graphrt.cache`, `graphrt.config`, `graphrt.kernels`.
"""
