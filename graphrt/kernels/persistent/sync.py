"""Dependency counters of the persistent step, and the L2 prefetch of a unit's weights.

    wait_for(ctr_ptr + i, target, err_ptr, SPIN)   # spin (acquire) until counter i >= target
    signal(ctr_ptr + i)                            # every thread's stores, then +1 (release)

A counter is an int32 in global memory. The producer's threads finish their stores, meet at a
CTA barrier, and one atomic add with release semantics (scope gpu) publishes them; the consumer
spins on an atomic read with acquire semantics, then meets its own threads at a barrier before
any of them reads the produced data (loaded with cache_modifier ".cg": from L2, never a stale
L1 line). Triton runs a scalar atomic on one thread and broadcasts the result.

Watchdog: a wait gives up after SPIN reads and sets ERR_STALL in the sticky error word instead
of hanging the GPU (the step's output is then garbage and the flag says so). With all programs
co-resident and the schedule's order (schedule.py) no correct step comes near the bound.

`prefetch_l2(ptr, nbytes)`: one `cp.async.bulk.prefetch.L2` by thread 0 (sm_90+): the whole
contiguous weight tile of a later unit streams into L2 while this unit computes. GPU only.
"""
from __future__ import annotations

import triton
import triton.language as tl

from graphrt.kernels.flags import ERR_STALL

SPIN_LIMIT = 1 << 20              # reads of a counter before the watchdog trips (about a second)


@triton.jit
def wait_for(ptr, target, err_ptr, SPIN):
    """Spin until *ptr >= target (target <= 0: returns after one read), then a CTA barrier."""
    seen = tl.atomic_add(ptr, 0, sem="acquire", scope="gpu")
    n = 0
    while (seen < target) & (n < SPIN):
        seen = tl.atomic_add(ptr, 0, sem="acquire", scope="gpu")
        n += 1
    if seen < target:
        tl.atomic_or(err_ptr, 32)  # ERR_STALL
    tl.debug_barrier()


@triton.jit
def signal(ptr):
    """Publish this program's stores: CTA barrier, then *ptr += 1 with release semantics."""
    tl.debug_barrier()
    tl.atomic_add(ptr, 1, sem="release", scope="gpu")


@triton.jit
def arrive(ptr):
    """*ptr += 1 (acquire-release) after a CTA barrier -> the value before: the last of n
    arrivals sees n - 1 and may read every earlier arrival's stores."""
    tl.debug_barrier()
    return tl.atomic_add(ptr, 1, sem="acq_rel", scope="gpu")


@triton.jit
def prefetch_l2(ptr, nbytes):
    """Thread 0 asks L2 for the nbytes (a multiple of 16, > 0) from ptr (16-byte aligned)."""
    tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [ptr.to(tl.int64), nbytes], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def field(row, f, k: tl.constexpr):
    """Element k of a unit row held as a [FP] vector (f = arange(FP))."""
    return tl.sum(tl.where(f == k, row, 0), axis=0)


__all__ = ["ERR_STALL", "SPIN_LIMIT", "wait_for", "signal", "arrive", "prefetch_l2", "field"]
