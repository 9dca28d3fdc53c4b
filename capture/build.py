"""The capture pipeline: build kernels, capture every bucket, verify, time, pick backends, write a cache."""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from graphrt import DecodeRuntime, PagedKVCache
from graphrt.cache.load import write_cache_manifest
from graphrt.config import XQA_PAGE_SIZES
from graphrt.attention.verify import (TOLERANCE, VerifyPlan, full_plan, random_batch, verify_bucket,
                            verify_lengths)


def candidate_backends(config, device: torch.device) -> list[str]:
    """What `backend: auto` chooses among on this device (each is tried; failures are skipped).
    On CUDA graphrt's own kernel (triton-decode) is measured against FlashInfer's per bucket."""
    if device.type != "cuda":
        return ["torch-splitkv"]
    if config.dtype == "float32":
        return ["torch-splitkv", "triton-decode"]
    fi = ["flashinfer", "xqa"] if config.page_size in XQA_PAGE_SIZES else ["flashinfer"]
    return fi + ["triton-decode"]


def time_bucket(rt: DecodeRuntime, size: int, *, steps: int = 30,
                lengths: tuple[int, ...] | None = None) -> tuple[float, float | None]:
    """(host µs, device µs) per step of a full bucket of requests cycling through `lengths`
    (default: the verification lengths).

    host: mean over a burst of replays without sync; device: CUDA events over replays (None on
    CPU, where the step runs eagerly and host time is the step time)."""
    gen = torch.Generator().manual_seed(size)
    q, table, lens = random_batch(rt, size, list(lengths or verify_lengths(rt.config)), gen)
    rt.decode(q, table, lens)
    view = rt.buffers.view(size)
    backend = rt.backend_for(size)
    lens_cpu = lens.cpu()
    steps = steps if rt.device.type == "cuda" else 2

    def step():  # a host-planned backend plans from lens_cpu inside replay()
        rt.replay(view, seq_lens_cpu=lens_cpu if backend.needs_host_inputs else None)

    sync = torch.cuda.synchronize if rt.device.type == "cuda" else (lambda: None)
    step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    host_us = (time.perf_counter() - t0) / steps * 1e6
    sync()
    if rt.device.type != "cuda":
        return host_us, None
    times = []
    for _ in range(3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(steps):
            rt.replay(view)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / steps)
    return host_us, statistics.median(times)


def pick_backends(config, kv, device, candidates: list[str], progress: bool) -> dict[int, str]:
    """Per bucket, the candidate with the lowest device time (host time where no device time)."""
    best: dict[int, tuple[float, str]] = {}
    for name in candidates:
        try:
            rt = DecodeRuntime(config, kv, device, backend=name)
            rt.capture(progress=progress)
            worst = max(verify_bucket(rt, b, seed=config.seed + b) for b in config.buckets)
        except Exception as e:  # noqa: BLE001 - a backend this GPU/library cannot run: skip it
            print(f"graphrt-capture: backend {name!r} skipped: {type(e).__name__}: {e}")
            continue
        if not worst <= TOLERANCE[config.dtype]:
            print(f"graphrt-capture: backend {name!r} skipped: rel err {worst:.2e} above tolerance")
            continue
        for b in config.buckets:
            host_us, dev_us = time_bucket(rt, b)
            cost = dev_us if dev_us is not None else host_us
            if b not in best or cost < best[b][0]:
                best[b] = (cost, name)
        del rt
    if not best:
        raise RuntimeError(f"backend auto: none of {candidates} ran on {device}")
    return {b: name for b, (_, name) in best.items()}


def build(config, device: torch.device, *, backend: str, steps: int, progress: bool,
          out_dir: Path | None = None,
          plan: VerifyPlan | None = None) -> tuple[DecodeRuntime, list[dict], float]:
    """Capture every bucket; verify + time the plan's buckets (default: all, standard lengths).

    Returns (runtime, per-bucket rows, setup seconds). Rows of buckets outside the plan have
    rel_err / host_us / device_us None; verified rows record their `verify_lengths`."""
    plan = plan or full_plan(config)
    kv = PagedKVCache.allocate(config, config.pool_pages, device)
    t0 = time.perf_counter()
    if backend == "auto":
        choice = pick_backends(config, kv, device, candidate_backends(config, device), progress)
        rt = DecodeRuntime(config, kv, device, bucket_backends=choice)
    else:
        rt = DecodeRuntime(config, kv, device, backend=backend)
    rt.capture(progress=progress)
    setup_s = time.perf_counter() - t0
    rows = rt.report()
    for row in rows:
        b = row["bucket"]
        row["backend_name"] = _backend_name(rt, b)
        row["rel_err"] = row["host_us"] = row["device_us"] = row["verify_lengths"] = None
        if b in plan.buckets:
            row["rel_err"] = verify_bucket(rt, b, seed=config.seed + b, steps=steps,
                                           lengths=plan.lengths)
            row["host_us"], row["device_us"] = time_bucket(rt, b, lengths=plan.lengths)
            row["verify_lengths"] = list(plan.lengths)
    tol = TOLERANCE[config.dtype]
    if out_dir is not None and all(r["rel_err"] is None or r["rel_err"] <= tol for r in rows):
        write_cache(rt, rows, Path(out_dir))  # no manifest (not a cache) if verification failed
    return rt, rows, setup_s


def _backend_name(rt: DecodeRuntime, bucket: int) -> str:
    backend = rt.backend_for(bucket)
    for name, b in rt.backends.items():
        if b is backend:
            return name
    raise KeyError(bucket)


def write_cache(rt: DecodeRuntime, rows: list[dict], out_dir: Path) -> str:
    """Hash every file and write the manifest; returns its sha256 (the digest to pin). The CLI
    pointed FlashInfer's JIT workspace and Triton's cache at out_dir before anything compiled, so
    the kernels were built there."""
    mode = "CUDA graphs" if rt.uses_graphs else "eager"
    return write_cache_manifest(out_dir, rt.config, rows, mode=mode)
