"""The all-reduce route (parallel/allreduce.py): the table's choice per message size is a pure
function of measured times, the reducer sends each message where the table says (NCCL when the
one-shot kernel cannot take it or is missing), setting up FlashInfer's kernel falls back to NCCL
with a WARNING naming why, and on CPU (gloo) nothing changes. The one-shot kernel itself runs in
tests/parallel/test_tp_gpu.py (two GPUs)."""
from __future__ import annotations

import logging
import sys

import pytest
import torch

from graphrt.parallel import TensorParallel
from graphrt.parallel.allreduce import NCCL_ONLY, AllReducer, AllReduceTable, configure
from graphrt.parallel.flashinfer_allreduce import open_oneshot


def test_table_from_measured_times():
    times = {8 << 10: {"nccl": 22.4, "oneshot": 6.0}, 32 << 10: {"nccl": 20.8, "oneshot": 7.5},
             128 << 10: {"nccl": 19.9, "oneshot": 12.0}, 1 << 20: {"nccl": 27.3, "oneshot": 40.0},
             8 << 20: {"nccl": 58.3, "oneshot": 300.0}}
    t = AllReduceTable.from_times(times)
    assert t.limits == ((128 << 10, "oneshot"),) and t.default == "nccl"
    assert [t.choose(n) for n in (1, 8 << 10, 100_000, 128 << 10, (128 << 10) + 1, 64 << 20)] == \
        ["oneshot"] * 4 + ["nccl"] * 2
    # NCCL faster in the middle: three runs; a size without a one-shot time takes NCCL
    mixed = AllReduceTable.from_times({10: {"nccl": 5, "oneshot": 1}, 20: {"nccl": 1, "oneshot": 5},
                                       30: {"nccl": 5, "oneshot": 1}, 40: {"nccl": 5}})
    assert mixed.limits == ((10, "oneshot"), (20, "nccl"), (30, "oneshot"))
    assert [mixed.choose(n) for n in (5, 15, 25, 35)] == ["oneshot", "nccl", "oneshot", "nccl"]
    assert AllReduceTable.from_times({10: {"nccl": 1, "oneshot": 1}}) == NCCL_ONLY    # a tie: NCCL
    assert NCCL_ONLY.choose(1) == "nccl"


@pytest.mark.parametrize("kw,match", [
    (dict(limits=((10, "oneshot"), (10, "nccl"))), r"limits\[1\]: max_bytes 10 must be an int > 10"),
    (dict(limits=((0, "nccl"),)), r"limits\[0\]: max_bytes 0"),
    (dict(limits=((10, "mpi"),)), r"limits\[0\]: method 'mpi' is not one of"),
    (dict(limits=(10,)), r"limits\[0\]: expected \(max_bytes, method\)"),
    (dict(default="oneshot2"), r"default: 'oneshot2'")])
def test_table_refuses_bad_rows(kw, match):
    with pytest.raises(ValueError, match=match):
        AllReduceTable(**kw)
    with pytest.raises(ValueError, match=r"times\[8\]: no time"):
        AllReduceTable.from_times({8: {"mpi": 1.0}})


class _FakeOneShot:
    """Stands for FlashInfer's kernel: sums as if 2 ranks held x, takes [<= 4, 8] float32 only."""
    def __init__(self):
        self.calls = 0

    def accepts(self, x):
        return x.dim() == 2 and x.shape[0] <= 4 and x.shape[1] == 8 and x.dtype == torch.float32

    def __call__(self, x):
        self.calls += 1
        return x * 2


def test_reducer_routes_by_size_and_falls_back():
    nccl_calls = []

    def nccl(x):
        nccl_calls.append(tuple(x.shape))
        return x.mul_(2)
    one = _FakeOneShot()
    red = AllReducer(AllReduceTable(((64, "oneshot"),)), nccl, one)      # <= 64 bytes: 2 rows of 8 fp32
    x = torch.ones(2, 8)
    y = red(x)
    assert torch.equal(y, torch.full((2, 8), 2.0)) and one.calls == 1 and not nccl_calls
    assert torch.equal(x, torch.ones(2, 8))                                # one-shot: a new tensor
    assert red.route(torch.ones(3, 8)) == "nccl"                           # 96 bytes: above the row
    assert red.route(torch.ones(1, 8, dtype=torch.float64)) == "nccl"      # the kernel refuses it
    red(torch.ones(8, 8))
    assert nccl_calls == [(8, 8)]
    assert AllReducer(AllReduceTable(((64, "oneshot"),)), nccl, None).route(torch.ones(1, 8)) == "nccl"
    tp = TensorParallel(rank=0, world_size=2, group=None, reducer=red)
    assert torch.equal(tp.all_reduce(torch.ones(1, 8)), torch.full((1, 8), 2.0)) and one.calls == 2
    assert tp == TensorParallel(rank=0, world_size=2, group=None)          # the route is not identity


def test_cpu_keeps_gloo_all_reduce_and_oneshot_falls_back_loudly(caplog, monkeypatch):
    tp = TensorParallel(rank=0, world_size=2, group=None)
    assert configure(tp, hidden=8, max_tokens=4, dtype=torch.float32, device="cpu") is tp
    assert configure(None, hidden=8, max_tokens=4, dtype=torch.float32, device="cpu") is None
    with pytest.raises(ValueError, match="allreduce: 'fast' is not 'auto' or 'nccl'"):
        configure(tp, hidden=8, max_tokens=4, dtype=torch.float32, device="cpu", mode="fast")
    with caplog.at_level(logging.WARNING, logger="graphrt.parallel"):
        assert open_oneshot(tp, max_tokens=4, hidden=8, dtype=torch.bfloat16, device="cpu") is None
        assert open_oneshot(tp, max_tokens=4, hidden=8, dtype=torch.float32, device="cuda:0") is None
        monkeypatch.setitem(sys.modules, "flashinfer", None)               # an import that fails
        monkeypatch.setitem(sys.modules, "flashinfer.comm", None)
        assert open_oneshot(tp, max_tokens=4, hidden=8, dtype=torch.bfloat16, device="cuda:0") is None
    msgs = [r.getMessage() for r in caplog.records]
    assert "one-shot all-reduce unavailable (device cpu is not CUDA); NCCL for every all-reduce" in msgs[0]
    assert "dtype torch.float32" in msgs[1]
    assert "import flashinfer.comm" in msgs[2]
