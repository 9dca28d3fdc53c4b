"""Per decode block: where the device time goes in the engine, read from a torch.profiler chrome
trace (and from CUDA events) that tools/device/engine_gaps.py records. Pure functions, no torch.

engine_gaps.py runs each executor run(Block) call inside a profiler range named by
`block_label` ("gaps.block k=4 n=1 b=1 u=4": k proposals a round, 0 for a plain block; n rows;
bucket b; u rounds or steps) and each prefill inside one named PREFILL. A block's device work is
what the CUDA runtime / driver calls inside its range launched, matched by correlation id (the
kernels of a cudaGraphLaunch carry its id). Per block, in µs:

    block_us     its first kernel's start to its last kernel's end (the graph and any eager work
                 launched in the call: a draft's catch-up)
    kernel_us    the sum of its graph kernels' durations (block_us - kernel_us - eager_us: bubbles)
    eager_us     the sum of its other device work (eager kernels, copies launched in the call)
    expected_us  units x the capture-time cost: graph_round_us[b][k], or graph_step_us[b] at k 0
    gap_us       its last kernel's end to the next block's first kernel's start
    outside_us   device busy time (union) inside that gap, of work launched outside every block
                 (the input batch's flush, the token copies, prefills)
    idle_us      gap_us - outside_us: the device waited for the host
    launch_us    the host time of the launch call (its range; profiled, so slower than without)

With CUDA events instead (no profiler: one event before and one after each block's launch call),
block_us is start event to end event and gap_us end to the next start (outside + idle together);
where the device was idle when the start event was recorded, block_us also holds the launch call's
host latency (the profiler's idle_us says how often).
"""
from __future__ import annotations

import bisect
import collections
import statistics

LABEL = "gaps.block"
PREFILL = "gaps.prefill"
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


def block_label(k: int, n: int, bucket: int, units: int) -> str:
    return f"{LABEL} k={k} n={n} b={bucket} u={units}"


def parse_label(name: str) -> dict:
    """block_label's fields back: {"k", "n", "bucket", "units"} (ints)."""
    f = dict(item.split("=") for item in name[len(LABEL):].split())
    return {"k": int(f["k"]), "n": int(f["n"]), "bucket": int(f["b"]), "units": int(f["u"])}


def _union(spans: list[tuple[float, float]], a: float, b: float) -> float:
    """Length of the union of `spans` clipped to [a, b]."""
    total, end = 0.0, a
    for s, e in sorted(spans):
        s, e = max(s, end), min(e, b)
        if e > s:
            total += e - s
            end = e
    return total


def blocks_from_trace(events: list[dict]) -> tuple[list[dict], int]:
    """(the decode blocks of a chrome trace's events in launch order, the device events whose
    correlation id names no launch call: expect 0). Per block: parse_label's fields, block_us,
    kernel_us, eager_us, gap_us, outside_us, idle_us (None without device work: a CPU run; the
    last block has no gap), launch_us and prefill_after (a prefill ran before the next block). The ranges
    and launches are the engine loop's, one thread: thread ids are not compared."""
    x = [e for e in events if e.get("ph") == "X"]
    marks = sorted((e for e in x if e.get("cat") == "user_annotation"
                    and e["name"].startswith((LABEL, PREFILL))), key=lambda e: e["ts"])
    blocks, ranges = [], []                                     # ranges: (start, end, block index)
    for m in marks:
        if m["name"] == PREFILL:
            if blocks:
                blocks[-1]["prefill_after"] = True
            continue
        ranges.append((m["ts"], m["ts"] + m.get("dur", 0), len(blocks)))
        blocks.append({**parse_label(m["name"]), "prefill_after": False, "launch_us": m.get("dur", 0), "_dev": []})
    owner = {}                                                  # correlation -> (block or None, graph launch?)
    for e in x:
        corr = e.get("args", {}).get("correlation")
        if e.get("cat") in LAUNCH_CATS and corr is not None:
            i = bisect.bisect_right(ranges, (e["ts"], float("inf"))) - 1
            owner[corr] = (ranges[i][2] if i >= 0 and e["ts"] <= ranges[i][1] else None,
                           "GraphLaunch" in e["name"])
    outside, unmatched = [], 0
    for e in x:
        if e.get("cat") not in DEVICE_CATS:
            continue
        corr = e.get("args", {}).get("correlation")
        unmatched += corr not in owner
        i, graph = owner.get(corr, (None, False))
        span = (e["ts"], e["ts"] + e.get("dur", 0), graph)
        (outside if i is None else blocks[i]["_dev"]).append(span)
    for b in blocks:
        dev = b.pop("_dev")
        b["block_us"] = max(e for _, e, _ in dev) - min(s for s, _, _ in dev) if dev else None
        b["kernel_us"] = sum(e - s for s, e, g in dev if g) if dev else None
        b["eager_us"] = sum(e - s for s, e, g in dev if not g) if dev else None
        b["_first"] = min((s for s, _, _ in dev), default=None)
        b["_last"] = max((e for _, e, _ in dev), default=None)
    outside = [(s, e) for s, e, _ in outside]
    for b, nxt in zip(blocks, blocks[1:] + [None]):
        b["gap_us"] = b["outside_us"] = b["idle_us"] = None
        if nxt is not None and b["_last"] is not None and nxt["_first"] is not None:
            a, z = b["_last"], nxt["_first"]
            b["gap_us"] = z - a
            b["outside_us"] = _union(outside, a, z)
            b["idle_us"] = b["gap_us"] - b["outside_us"]
    for b in blocks:
        del b["_first"], b["_last"]
    return blocks, unmatched


def blocks_from_events(marks: list[tuple]) -> list[dict]:
    """The decode blocks of CUDA event marks, in launch order: (label, start_us, end_us) per block
    (times from any one reference) or (PREFILL, None, None) -> parse_label's fields plus block_us,
    gap_us (None for the last) and prefill_after."""
    blocks = []
    for label, a, z in marks:
        if label == PREFILL:
            if blocks:
                blocks[-1]["prefill_after"] = True
            continue
        blocks.append({**parse_label(label), "prefill_after": False, "block_us": z - a, "_a": a, "_z": z})
    for b, nxt in zip(blocks, blocks[1:] + [None]):
        b["gap_us"] = None if nxt is None else nxt["_a"] - b["_z"]
    for b in blocks:
        del b["_a"], b["_z"]
    return blocks


def cost_table(costs: dict | None) -> dict:
    """{(bucket, k): µs per round (k > 0) or per step (k = 0)} of costs {"graph_step_us": {b: us},
    "graph_round_us": {b: {k: us}}} (keys ints or their strings, as JSON gives them back)."""
    if not costs:
        return {}
    out = {(int(b), 0): us for b, us in costs.get("graph_step_us", {}).items()}
    for b, by_k in costs.get("graph_round_us", {}).items():
        out.update({(int(b), int(k)): us for k, us in by_k.items()})
    return out


def with_expected(blocks: list[dict], costs: dict | None) -> list[dict]:
    """Each block with expected_us: units x its capture-time cost (None where unknown)."""
    table = cost_table(costs)
    for b in blocks:
        us = table.get((b["bucket"], b["k"]))
        b["expected_us"] = None if us is None else b["units"] * us
    return blocks


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


FIELDS = ("block_us", "expected_us", "kernel_us", "eager_us", "gap_us", "outside_us", "idle_us", "launch_us")


def summarize(blocks: list[dict], *, trim: int = 2, wall_us: float | None = None) -> dict:
    """Medians and shares over the steady blocks of one run: all but the first and last `trim`
    (the request's start and end).
    by_k: {k: {"blocks", the FIELDS' medians, "x": median block_us / expected_us}} over the steady
      blocks followed by a block of the same k and no prefill (a switch's gap apart);
    switch: the same over the steady blocks followed by a block of another k;
    share: of the steady window (sum of block_us + gap_us; "window_us") the part at the
      capture-time costs ("expected"), the blocks' excess over them ("excess"), and the gaps' device
      work launched outside the blocks ("outside") and idle time ("idle"); with the events' blocks
      (no outside / idle) the gaps together ("gap"). wall_us (the run's host wall): "edges", the
      share of it outside the decode window (first block start to last block end: prefill, the
      first and last blocks' read-back)."""
    steady = [b for b in blocks[trim:len(blocks) - trim] if b["gap_us"] is not None]
    keys = [f for f in FIELDS if any(b.get(f) is not None for b in blocks)]

    def medians(group):
        out = {"blocks": len(group), **{f: _median(b.get(f) for b in group) for f in keys}}
        out["x"] = _median(b["block_us"] / b["expected_us"] for b in group
                           if b.get("expected_us") and b["block_us"] is not None)
        return out
    nxt = {id(b): n for b, n in zip(blocks, blocks[1:])}
    same = collections.defaultdict(list)
    for b in steady:
        if nxt[id(b)]["k"] == b["k"] and not b["prefill_after"]:
            same[b["k"]].append(b)
    switch = [b for b in steady if nxt[id(b)]["k"] != b["k"]]
    out = {"blocks": len(blocks), "steady": len(steady),
           "by_k": {k: medians(g) for k, g in sorted(same.items())},
           "switch": medians(switch) if switch else None}
    timed = [b for b in steady if b["block_us"] is not None]
    window = sum(b["block_us"] + b["gap_us"] for b in timed)
    if window > 0:
        share = {"window_us": window}
        if all(b.get("expected_us") is not None for b in timed):
            exp = sum(b["expected_us"] for b in timed)
            share.update(expected=exp / window, excess=sum(b["block_us"] for b in timed) / window - exp / window)
        if "idle_us" in keys:
            share.update(outside=sum(b["outside_us"] for b in timed) / window,
                         idle=sum(b["idle_us"] for b in timed) / window)
        else:
            share["gap"] = sum(b["gap_us"] for b in timed) / window
        out["share"] = share
    if wall_us and any(b["block_us"] is not None for b in blocks):
        span = sum(b["block_us"] + (b["gap_us"] or 0.0) for b in blocks if b["block_us"] is not None)
        out["edges"] = max(0.0, 1.0 - span / wall_us)
    return out


def table(rows: list[dict]) -> str:
    """The closing table: per config and k, the profiler's medians (block / expected / x, kernels,
    gap = outside + idle) and the events' (block, gap); then per config the shares of the steady
    window. rows: engine_gaps rows with "blocks": {"profiler": summarize(...), "events": ...}."""
    def f(v, nd=0):
        return "-" if v is None else f"{v:.{nd}f}"
    head = (f"{'config':<14}{'k':>3}{'blks':>5}{'block':>8}{'expect':>8}{'x':>6}{'kernels':>9}{'gap':>7}"
            f"{'outside':>9}{'idle':>7} | {'ev.block':>8}{'ev.gap':>7}{'ev.x':>6}")
    lines = ["per block, steady-state medians (us; switch: the blocks before a change of k)", head]
    shares = ["share of the steady decode window (profiler | events; edges: of the events run's wall)",
              f"{'config':<14}{'expected':>9}{'excess':>8}{'outside':>8}{'idle':>7} | "
              f"{'expected':>9}{'excess':>8}{'gap':>7}{'edges':>7}"]
    for r in rows:
        g = r.get("blocks") or {}
        p, e = g.get("profiler") or {}, g.get("events") or {}
        name = f"{r['spec'].split('=')[0]}:{r['bs']}"
        pk, ek = p.get("by_k", {}), e.get("by_k", {})
        groups = [(k, pk.get(k), ek.get(k)) for k in sorted(set(pk) | set(ek))]
        if p.get("switch") or e.get("switch"):
            groups.append(("sw", p.get("switch"), e.get("switch")))
        for k, a, b in groups:
            a, b = a or {}, b or {}
            lines.append(f"{name:<14}{k:>3}{a.get('blocks', b.get('blocks', 0)):>5}{f(a.get('block_us')):>8}"
                         f"{f(a.get('expected_us')):>8}{f(a.get('x'), 2):>6}{f(a.get('kernel_us')):>9}"
                         f"{f(a.get('gap_us')):>7}{f(a.get('outside_us')):>9}{f(a.get('idle_us')):>7} | "
                         f"{f(b.get('block_us')):>8}{f(b.get('gap_us')):>7}{f(b.get('x'), 2):>6}")
        ps, es = p.get("share", {}), e.get("share", {})
        shares.append(f"{name:<14}{f(ps.get('expected'), 2):>9}{f(ps.get('excess'), 2):>8}"
                      f"{f(ps.get('outside'), 2):>8}{f(ps.get('idle'), 2):>7} | {f(es.get('expected'), 2):>9}"
                      f"{f(es.get('excess'), 2):>8}{f(es.get('gap'), 2):>7}{f(e.get('edges'), 2):>7}")
    return "\n".join(lines + [""] + shares)
