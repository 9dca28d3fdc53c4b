"""Compile FlashInfer's JIT modules that graphrt's GPU paths use, ahead of the tests that need them.

Run in the background at the start of a device call: each (head_dim, KV dtype) pair builds the
CUDA-core decode module, the tensor-core (prefill-family) decode module and the FA2 prefill
module by planning and running one tiny batch. FlashInfer serialises builds of one module with a
file lock, so a test asking for the same module meanwhile waits for it instead of compiling twice.

    python tools/device/jit_warm.py --head-dims 64,128 --kv bf16,fp8
"""
from __future__ import annotations

import argparse
import time

import torch


def warm(fi, head_dim: int, kv_dtype: torch.dtype, page: int = 16) -> None:
    """One decode (both kernel families) and one prefill run at (head_dim, kv_dtype), 32 q heads /
    8 KV heads, bf16 q, one page of KV on cuda:0."""
    dev = torch.device("cuda")
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device=dev)
    kv = torch.randn(1, 2, page, 8, head_dim, device=dev, dtype=torch.bfloat16).to(kv_dtype)
    indptr = torch.tensor([0, 1], dtype=torch.int32, device=dev)
    indices = torch.tensor([0], dtype=torch.int32, device=dev)
    last = torch.tensor([page], dtype=torch.int32, device=dev)
    q = torch.randn(1, 32, head_dim, device=dev, dtype=torch.bfloat16)
    for tc in (False, True):
        w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tc)
        w.plan(indptr, indices, last, 32, 8, head_dim, page, q_data_type=torch.bfloat16,
               kv_data_type=kv_dtype)
        w.run(q, kv)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend="fa2")
    qo = torch.tensor([0, 4], dtype=torch.int32, device=dev)
    w.plan(qo, indptr, indices, last, 32, 8, head_dim, page, causal=True,
           q_data_type=torch.bfloat16, kv_data_type=kv_dtype)
    w.run(torch.randn(4, 32, head_dim, device=dev, dtype=torch.bfloat16), kv)
    torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--kv", default="bf16,fp8")
    a = ap.parse_args()
    import flashinfer
    dtypes = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
    for hd in (int(x) for x in a.head_dims.split(",")):
        for name in a.kv.split(","):
            t = time.perf_counter()
            try:
                warm(flashinfer, hd, dtypes[name])
                print(f"jit_warm: head_dim {hd} kv {name}: {time.perf_counter() - t:.0f} s", flush=True)
            except Exception as e:   # a module that cannot build is the tests' to report
                print(f"jit_warm: head_dim {hd} kv {name}: FAILED {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    main()
