"""graphrt-capture without CUDA: which backend runs, what is verified, and when to stop instead.

On a CPU the pipeline runs eagerly: the Triton prepare kernel (metadata + device planner) under
TRITON_INTERPRET=1 and the planned split-KV schedule executed by the torch-splitkv backend, each
verified bucket checked against the float32 reference. Large presets (32k context, 256-row
buckets) would take hours that way, so the CPU verifies a subset (graphrt.attention.verify.cpu_plan) and
says so. Everything here is decided before anything is allocated; a `CpuRefusal` carries the
one-line reason and what to run instead.
"""
from __future__ import annotations

from pathlib import Path

from graphrt.attention.verify import VerifyPlan, cpu_plan, cpu_step_cost, make_plan

GPU_BACKENDS = ("flashinfer", "flashinfer-hostplan", "xqa")
CPU_BACKEND = "torch-splitkv"
KV_MEMORY_FRACTION = 0.5  # the KV pool may take at most this share of the available memory


class CpuRefusal(Exception):
    """graphrt-capture cannot do what was asked on this CPU machine (one-line message)."""


def cpu_backend(config_backend: str, cli_backend: str | None) -> tuple[str, str | None]:
    """(backend to run, note to print or None). An explicit GPU-only --backend is refused."""
    if cli_backend in GPU_BACKENDS:
        raise CpuRefusal(f"--backend {cli_backend} needs a CUDA GPU and this machine has none; "
                         f"drop --backend (a CPU runs the config with {CPU_BACKEND}) or run on a "
                         f"GPU machine")
    backend = cli_backend or config_backend
    if backend in GPU_BACKENDS or backend == "auto":
        why = ("its only candidate on a CPU" if backend == "auto" else f"backend {backend!r} "
               "needs a GPU")
        return CPU_BACKEND, (f"graphrt-capture: no CUDA device: running eagerly with the "
                             f"{CPU_BACKEND} backend (the device planner's schedule executed in "
                             f"torch; {why})")
    return backend, None


def check_memory(config, *, meminfo: Path = Path("/proc/meminfo")) -> None:
    """Refuse a KV pool that does not fit comfortably in this machine's available memory."""
    import torch
    itemsize = torch.empty((), dtype=config.torch_dtype).element_size()
    need = 2 * config.pool_pages * config.page_size * config.num_kv_heads * config.head_dim * itemsize
    avail = _available_bytes(meminfo)
    if avail is not None and need > KV_MEMORY_FRACTION * avail:
        raise CpuRefusal(f"config {config.name}: its KV pool (kv_pool_pages {config.pool_pages}) "
                         f"needs {need / 2**30:.1f} GiB and this machine has {avail / 2**30:.1f} GiB "
                         f"available; lower kv_pool_pages in a copy of the config, or run on a GPU")


def _available_bytes(meminfo: Path) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None  # not Linux: no check


def choose_plan(config, *, buckets, lengths) -> VerifyPlan:
    """The explicit --verify-buckets / --verify-lengths, else the CPU budget's choice."""
    if buckets is not None or lengths is not None:
        return make_plan(config, buckets=buckets, lengths=lengths)
    plan = cpu_plan(config)
    if plan is None:
        cost = cpu_step_cost(config, config.buckets[0])
        raise CpuRefusal(f"config {config.name}: even bucket {config.buckets[0]} is too slow to "
                         f"verify on a CPU (max_pages_per_seq {config.max_pages_per_seq}, cost "
                         f"{cost} units per step); run it on a GPU, or choose with "
                         f"--verify-buckets / --verify-lengths")
    return plan


def plan_summary(config, plan: VerifyPlan, *, on_cpu: bool, config_path: str) -> str:
    """One line saying what a partial plan verified and what full verification takes."""
    what = (f"verified buckets {list(plan.buckets)} with lengths {list(plan.lengths)} (of "
            f"{len(config.buckets)} buckets, lengths up to {config.max_context_len})")
    if on_cpu:
        return f"CPU: {what}; full verification needs a GPU: graphrt-capture --config {config_path}"
    return f"{what}, as asked by --verify-buckets / --verify-lengths; the other buckets are unverified"
