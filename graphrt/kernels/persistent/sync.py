"""Dependency counters of the persistent step, and the L2 prefetch of a unit's weights.

    wait_for(ctr_ptr + i, target, err_ptr, SPIN, ts, TIMELINE)   # spin (acquire) until counter i >= target
    signal(ctr_ptr + i, n)                         # every thread's stores, then +n (release)

A counter is an int32 in global memory. The producer's threads finish their stores, meet at a
CTA barrier, and one atomic add with release semantics (scope gpu) publishes them; the consumer
spins on an atomic read with acquire semantics, then meets its own threads at a barrier before
any of them reads the produced data (loaded with cache_modifier ".cg": from L2, never a stale
L1 line). Triton runs a scalar atomic on one thread and broadcasts the result.

A unit whose wait an earlier unit of the same program already met carries target 0 and skips
the wait (no atomic at all); a program signals once per run of units that signal the same
counter, adding the run's length (schedule.py).

`wait_in_loop`: the same wait for a unit that waits inside its GEMV loop (the shared-memory
weight ring, gemv_ring.py): Triton's software pipeliner does not pipeline a loop that holds
another loop, so on the GPU the spin is one inline-PTX loop (`spin_acquire`: every thread polls
with relaxed loads, then one acquire load, so each thread's later reads are ordered after the
producers' release without a CTA barrier); the interpreter runs `wait_for`.

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
def wait_for(ptr, target, err_ptr, SPIN, ts, TIMELINE: tl.constexpr):
    """Spin until *ptr >= target, then a CTA barrier; target <= 0: returns at once (no read).
    TIMELINE: the time it returns into ts[1] (the unit's timeline row)."""
    if target > 0:
        seen = tl.atomic_add(ptr, 0, sem="acquire", scope="gpu")
        n = 0
        while (seen < target) & (n < SPIN):
            seen = tl.atomic_add(ptr, 0, sem="acquire", scope="gpu")
            n += 1
        if seen < target:
            tl.atomic_or(err_ptr, 32)  # ERR_STALL
        tl.debug_barrier()
    if TIMELINE:
        tl.store(ts + 1, timer(target))


@triton.jit
def spin_acquire(ptr, target, SPIN):
    """Every thread reads *ptr (ld.relaxed.gpu) until it is >= target or SPIN reads have been made,
    then once more with ld.acquire.gpu -> that last value (int32; >= target unless the watchdog
    ran out: counters only grow within a launch). One inline-PTX loop (GPU only)."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b32 n; mov.b32 n, 0; "
        "SPIN_POLL: ld.relaxed.gpu.global.b32 $0, [$1]; add.s32 n, n, 1; setp.lt.s32 p, $0, $2; "
        "@!p bra SPIN_SEEN; setp.lt.s32 p, n, $3; @p bra SPIN_POLL; "
        "SPIN_SEEN: ld.acquire.gpu.global.b32 $0, [$1]; }",
        "=r,l,r,r", [ptr.to(tl.int64, bitcast=True), target, SPIN], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def wait_in_loop(ptr, target, err_ptr, SPIN, ts, TIMELINE: tl.constexpr, INTERP: tl.constexpr):
    """wait_for without a loop in the Triton IR (the GPU: `spin_acquire`, every thread acquires;
    INTERP, the interpreter: wait_for itself)."""
    if INTERP:
        wait_for(ptr, target, err_ptr, SPIN, ts, TIMELINE)
    else:
        if target > 0:
            if spin_acquire(ptr, target, SPIN) < target:
                tl.atomic_or(err_ptr, 32)  # ERR_STALL
        if TIMELINE:
            tl.store(ts + 1, timer(target))


@triton.jit
def signal(ptr, n):
    """Publish this program's stores: CTA barrier, then *ptr += n with release semantics
    (n <= 0: nothing)."""
    if n > 0:
        tl.debug_barrier()
        tl.atomic_add(ptr, n, sem="release", scope="gpu")


@triton.jit
def arrive(ptr, n):
    """*ptr += n (acquire-release) after a CTA barrier -> the value before: the arrival that
    brings the count to its total sees total - n and may read every earlier arrival's stores."""
    tl.debug_barrier()
    return tl.atomic_add(ptr, n, sem="acq_rel", scope="gpu")


@triton.jit
def timer(x):
    """The GPU's global nanosecond timer (int64; x: any int32 scalar, orders the read after it)."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [x], dtype=tl.int64, is_pure=False,
                                     pack=1)


@triton.jit
def prefetch_l2(ptr, nbytes):
    """Thread 0 asks L2 for the nbytes (a multiple of 16, > 0) from ptr (16-byte aligned)."""
    tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [ptr.to(tl.int64), nbytes], dtype=tl.int32, is_pure=False, pack=1)


__all__ = ["ERR_STALL", "SPIN_LIMIT", "wait_for", "wait_in_loop", "spin_acquire", "signal", "arrive", "prefetch_l2",
           "timer"]
