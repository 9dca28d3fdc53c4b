"""Which all-reduce each message takes: NCCL, or a one-shot kernel over NVLink peer memory.

    table = AllReduceTable.from_times({8192: {"nccl": 22.4, "oneshot": 6.1}, 8 << 20: {...}})
    table.choose(nbytes)                      # "nccl" | "oneshot": a pure host function
    tp = configure(tp, hidden=4096, max_tokens=16, dtype=torch.bfloat16, device=dev)
    y = tp.all_reduce(x)                      # routed by x's size (group.py)

At decode batch sizes an all-reduce moves a few KB to a few hundred KB, where NCCL's latency
(~20-25 µs on two H200s, inside a CUDA graph) dwarfs the transfer; a one-shot all-reduce (every
rank reads every peer's buffer over NVLink and sums, one kernel) takes a few µs. NCCL stays for
large messages and is the fallback whenever the one-shot kernel is unavailable
(`graphrt.parallel.flashinfer_allreduce`, logged at WARNING naming why).

The choice is made once per message size, on the host, before any graph is captured, from a
table measured on this host at start-up (`measure_table`): every rank measures, the times are
reduced with MAX over the ranks, so every rank picks the same method for the same shape (two
ranks that disagree would wait on different collectives forever). A captured graph therefore
holds one fixed kernel per all-reduce. On CPU (gloo) the path is always torch.distributed's
all_reduce.
"""
from __future__ import annotations

import bisect
import dataclasses
import logging
from dataclasses import dataclass

import torch

log = logging.getLogger("graphrt.parallel")

METHODS = ("nccl", "oneshot")


@dataclass(frozen=True)
class AllReduceTable:
    """limits: ((max_bytes, method), ...) with max_bytes strictly increasing; a message of n
    bytes takes the method of the first row with n <= max_bytes, and `default` above the last
    row (NCCL: large messages are bandwidth-bound, NCCL's ring is made for them)."""
    limits: tuple[tuple[int, str], ...] = ()
    default: str = "nccl"

    def __post_init__(self):
        if self.default not in METHODS:
            raise ValueError(f"default: {self.default!r} is not one of {METHODS}")
        prev = 0
        for i, row in enumerate(self.limits):
            if not (isinstance(row, tuple) and len(row) == 2):
                raise ValueError(f"limits[{i}]: expected (max_bytes, method), got {row!r}")
            n, method = row
            if isinstance(n, bool) or not isinstance(n, int) or n <= prev:
                raise ValueError(f"limits[{i}]: max_bytes {n!r} must be an int > {prev} (increasing)")
            if method not in METHODS:
                raise ValueError(f"limits[{i}]: method {method!r} is not one of {METHODS}")
            prev = n

    def choose(self, nbytes: int) -> str:
        """The method for a message of `nbytes` bytes."""
        i = bisect.bisect_left([n for n, _ in self.limits], nbytes)
        return self.limits[i][1] if i < len(self.limits) else self.default

    @classmethod
    def from_times(cls, times: dict[int, dict[str, float]]) -> "AllReduceTable":
        """{message bytes: {method: µs}} measured -> the fastest method per measured size; a size
        between two measured ones takes the larger one's choice; above the largest, NCCL. A
        method missing from a size's entry is not a candidate there."""
        rows: list[tuple[int, str]] = []
        for n in sorted(times):
            cands = {m: t for m, t in times[n].items() if m in METHODS}
            if not cands:
                raise ValueError(f"times[{n}]: no time for any of {METHODS}")
            best = min(cands, key=lambda m: (cands[m], METHODS.index(m)))
            if rows and rows[-1][1] == best:
                rows[-1] = (n, best)                        # extend the run
            else:
                rows.append((n, best))
        while rows and rows[-1][1] == "nccl":               # the default covers them
            rows.pop()
        return cls(tuple(rows))

    def as_dict(self) -> dict:
        return {"limits": [list(r) for r in self.limits], "default": self.default}


NCCL_ONLY = AllReduceTable()


class AllReducer:
    """The per-message route of a TensorParallel's all-reduce. nccl(x): in-place sum, returns x
    (torch.distributed on the group); oneshot: a callable x -> the sum in a new tensor, or None
    (then every message takes NCCL); accepts(x): whether the one-shot kernel can take x (its
    dtype, its size within the workspace). Both ranks see the same shapes, so the route agrees."""

    def __init__(self, table: AllReduceTable, nccl, oneshot=None):
        self.table, self.nccl, self.oneshot = table, nccl, oneshot

    def route(self, x: torch.Tensor) -> str:
        if self.oneshot is None or not self.oneshot.accepts(x):
            return "nccl"
        return self.table.choose(x.numel() * x.element_size())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.route(x) == "oneshot":
            return self.oneshot(x)
        return self.nccl(x)


def measure_table(tp, oneshot, *, sizes: list[int], hidden: int, dtype: torch.dtype, device,
                  reps: int = 32) -> tuple[AllReduceTable, dict]:
    """CUDA, every rank at once: µs per all-reduce of [n, hidden] for n in sizes, NCCL and
    one-shot, each `reps` calls in one CUDA graph (graphrt.kernels.timing.graph_us); times
    reduced with MAX over the ranks (one decision everywhere). -> (table, {bytes: {method: µs}})."""
    import torch.distributed as dist

    from graphrt.kernels.timing import graph_us
    times: dict[int, dict[str, float]] = {}
    for n in sizes:
        x = torch.ones((n, hidden), dtype=dtype, device=device)
        row = {"nccl": graph_us(lambda: dist.all_reduce(x, group=tp.group), reps, 3, mode="thread_local")}
        if oneshot is not None and oneshot.accepts(x):
            row["oneshot"] = graph_us(lambda: oneshot(x), reps, 3, mode="thread_local")
        t = torch.tensor([row.get(m, float("inf")) for m in METHODS], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=tp.group)
        times[x.numel() * x.element_size()] = {m: v for m, v in zip(METHODS, t.tolist()) if v != float("inf")}
    return AllReduceTable.from_times(times), times


def configure(tp, *, hidden: int, max_tokens: int, dtype: torch.dtype, device, mode: str = "auto"):
    """tp (a TensorParallel, or None) with its all-reduce routed per message size. mode "nccl":
    unchanged; "auto": on CUDA, the one-shot kernel where it measures faster (every rank must
    call this at the same point: it runs collectives); on CPU, unchanged (gloo's all_reduce)."""
    if mode not in ("auto", "nccl"):
        raise ValueError(f"allreduce: {mode!r} is not 'auto' or 'nccl'")
    if tp is None or tp.world_size == 1 or mode == "nccl" or torch.device(device).type != "cuda":
        return tp
    from graphrt.parallel.flashinfer_allreduce import open_oneshot
    import torch.distributed as dist
    oneshot = open_oneshot(tp, max_tokens=max_tokens, hidden=hidden, dtype=dtype, device=device)
    ready = torch.tensor([oneshot is not None], dtype=torch.int32, device=device)
    dist.all_reduce(ready, op=dist.ReduceOp.MIN, group=tp.group)      # one answer on every rank
    if not bool(ready.item()):                          # logged where it failed: NCCL everywhere
        if oneshot is not None:
            log.warning("tensor parallel: another rank has no one-shot all-reduce; NCCL for every all-reduce")
        return tp
    sizes = sorted({1, 2, 4, 8, 16, 32, 64, max_tokens} & set(range(1, max_tokens + 1)))
    table, times = measure_table(tp, oneshot, sizes=sizes, hidden=hidden, dtype=dtype, device=device)
    log.info("tensor parallel: all-reduce table %s (µs by message bytes, MAX over ranks: %s)",
             table.as_dict(), times)
    return dataclasses.replace(tp, reducer=AllReducer(table, tp.nccl_all_reduce, oneshot))


__all__ = ["AllReduceTable", "AllReducer", "METHODS", "NCCL_ONLY", "configure", "measure_table"]
