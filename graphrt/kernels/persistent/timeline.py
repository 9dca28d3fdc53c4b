"""Reading the persistent step's per-unit timeline (PersistentStep(timeline=True)), on the host.

    step = PersistentStep(..., timeline=True); step.launch(...); torch.cuda.synchronize()
    nbytes = unit_bytes(step.schedule, seq_lens_cpu, kv_bytes=2)
    report = summarize(step.schedule, step.timeline.cpu(), nbytes)
    report["kinds"]["down"]   # {"units", "us", "wait_us", "work_us", "us_per_unit", "bytes", "gb_s", ...}

The kernel writes, per unit row u (schedule order), [start, waited, end, program] in the GPU's
global timer (ns): start before the unit's weight loads, waited when its wait returned (at
once for a unit whose wait an earlier unit met), end after its stores and signal; and per
program p, row N + p: [start, end, -, p]. For a unit: wait = waited - start (its inputs not
ready yet; the weight loads it issued first are in flight meanwhile), work = end - waited.
"""
from __future__ import annotations

from graphrt.kernels.persistent.schedule import F_A, F_C, F_OP, F_WB, OP_ATT, OP_GU, OP_NAMES, Schedule

COLUMNS = ("start", "waited", "end", "program")


def split_range(seq_len: int, sp: int, splits: int, block_kv: int, min_keys: int) -> tuple[int, int]:
    """Cached key positions [lo, hi) split sp of `splits` reads for a row of seq_len tokens
    (the attention unit's rule, units.attention_unit)."""
    pos = max(seq_len - 1, 0)
    n_blocks = -(-pos // block_kv)
    if splits > 1:
        want = min(max(-(-pos // min_keys), 1), splits)
        per = max(-(-n_blocks // want), 1)
    else:
        per = n_blocks
    lo = sp * per * block_kv
    return lo, max(lo, min(lo + per * block_kv, pos))


def unit_bytes(s: Schedule, seq_lens, *, kv_bytes: int) -> list[int]:
    """Bytes each unit row of s streams: its weight tile (F_WB; gate and up for gate_up), or for
    an attention unit its split's cached K and V of one kv head (seq_lens: [B] host ints;
    kv_bytes: bytes per cached element)."""
    g, t = s.geometry, s.tiles
    lens = [int(n) for n in seq_lens]
    out = []
    for u in s.units:
        if u[F_OP] == OP_ATT:
            lo, hi = split_range(lens[u[F_A]], u[F_C], s.splits, t.block_kv, t.min_keys)
            out.append((hi - lo) * 2 * g.head_dim * kv_bytes)
        else:
            out.append(u[F_WB] * (2 if u[F_OP] == OP_GU else 1))
    return out


def summarize(s: Schedule, timeline, nbytes: list[int]) -> dict:
    """Per unit kind and in all: units, us (start to end, summed), wait_us, work_us, us_per_unit,
    bytes, gb_s (bytes over work time: one program's rate while it streams); the step's span
    (first program start to last program end, µs), each program's busy share, the aggregate
    rate (all bytes over the span). timeline: [N + P, 4] int64 (CPU)."""
    rows = timeline.tolist()
    n, p = len(s.units), s.programs
    if len(rows) != n + p:
        raise ValueError(f"timeline: expected {n + p} rows (units + programs), got {len(rows)}")
    kinds: dict[str, dict] = {}
    for u, (t0, t1, t2, _), b in zip(s.units, rows[:n], nbytes):
        k = kinds.setdefault(OP_NAMES[u[F_OP]], dict(units=0, us=0.0, wait_us=0.0, work_us=0.0, bytes=0))
        k["units"] += 1
        k["us"] += (t2 - t0) / 1e3
        k["wait_us"] += (t1 - t0) / 1e3
        k["work_us"] += (t2 - t1) / 1e3
        k["bytes"] += b
    for k in kinds.values():
        k["us_per_unit"] = k["us"] / k["units"]
        k["gb_s"] = k["bytes"] / (k["work_us"] * 1e3) if k["work_us"] > 0 else 0.0
    prog = rows[n:]
    span_ns = max(r[1] for r in prog) - min(r[0] for r in prog)
    busy = [sum(rows[i][2] - rows[i][0] for i in range(s.starts[q], s.starts[q + 1])) for q in range(p)]
    total = dict(units=n, us=sum(k["us"] for k in kinds.values()), wait_us=sum(k["wait_us"] for k in kinds.values()),
                 work_us=sum(k["work_us"] for k in kinds.values()), bytes=sum(nbytes))
    return {"kinds": kinds, "total": total, "span_us": span_ns / 1e3,
            "program_us": [(r[1] - r[0]) / 1e3 for r in prog],
            "busy_share": [b / max(r[1] - r[0], 1) for b, r in zip(busy, prog)],
            "aggregate_gb_s": sum(nbytes) / max(span_ns, 1),
            "timer_step_ns": _timer_step(rows[:n])}


def _timer_step(rows) -> int:
    """The smallest non-zero difference between two stamps of one unit: the timer's resolution
    as seen (the global timer ticks at 32 ns to 1 µs depending on the GPU and driver)."""
    deltas = [d for r in rows for d in (r[1] - r[0], r[2] - r[1]) if d > 0]
    return min(deltas) if deltas else 0


def layers_table(s: Schedule, timeline) -> list[dict]:
    """Per layer (and the LM head as layer L): first unit start to last unit end (µs, relative
    to the step's start) and each kind's window, from the timeline."""
    rows = timeline.tolist()
    n = len(s.units)
    t0 = min(r[0] for r in rows[n:])
    out: dict[int, dict] = {}
    for u, r in zip(s.units, rows[:n]):
        layer = u[1]
        d = out.setdefault(layer, {"layer": layer})
        name = OP_NAMES[u[F_OP]]
        lo, hi = (r[0] - t0) / 1e3, (r[2] - t0) / 1e3
        w = d.setdefault(name, [lo, hi])
        w[0], w[1] = min(w[0], lo), max(w[1], hi)
    return [out[k] for k in sorted(out)]


__all__ = ["COLUMNS", "split_range", "unit_bytes", "summarize", "layers_table"]
