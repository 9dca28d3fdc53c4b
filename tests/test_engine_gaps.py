"""tools/device/engine_gaps.py's per-block reading (tools/device/block_gaps.py) over a synthetic
chrome trace with known answers; its block marks and cost reading over stand-ins for the engine;
the CLI's --help and a bad --block-tokens."""
from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from graphrt.worker.launch import Block, Draw

DEVICE = Path(__file__).resolve().parents[1] / "tools" / "device"
sys.path.insert(0, str(DEVICE))

from block_gaps import (PREFILL, block_label, blocks_from_events, blocks_from_trace, cost_table,  # noqa: E402
                        parse_label, summarize, table, with_expected)

COSTS = {"graph_step_us": {"1": 100.0}, "graph_round_us": {"1": {"4": 110.0}}}   # as JSON gives them back


def _x(cat, name, ts, dur, corr=None, tid=1):
    e = {"ph": "X", "cat": cat, "name": name, "pid": tid, "tid": tid, "ts": ts, "dur": dur}
    if corr is not None:
        e["args"] = {"correlation": corr}
    return e


def _trace():
    """A prefill, then blocks k = 4, 4, 4, 0, 0 (units 4): each a host range holding a
    cudaGraphLaunch whose graph runs two kernels (block i: 200 + 10 i us of kernels, 20 us
    bubble between them); block 1 also launches an eager 5 us kernel inside its range. After each
    range a cudaMemcpyAsync whose 8 us copy runs in the gap; the next graph starts 50 + i us
    after the block's last kernel ends (so the idle time is 42 + i us)."""
    ev = [_x("user_annotation", PREFILL, 0, 30), _x("kernel", "prefill", 40, 60, corr=1),
          _x("cuda_runtime", "cudaLaunchKernel", 10, 3, corr=1)]
    ks, host, dev, corr = [4, 4, 4, 0, 0], 1000.0, 200.0, 100
    for i, k in enumerate(ks):
        ev.append(_x("user_annotation", block_label(k, 1, 1, 4), host, 40))
        ev.append(_x("cuda_runtime", "cudaGraphLaunch", host + 5, 10, corr=corr))
        half = (200 + 10 * i) / 2
        ev += [_x("kernel", "gemm", dev, half, corr=corr), _x("kernel", "attn", dev + half + 20, half, corr=corr)]
        end = dev + 2 * half + 20
        if i == 1:                       # an eager kernel launched inside the block's range
            ev += [_x("cuda_runtime", "cudaLaunchKernel", host + 20, 3, corr=corr + 1),
                   _x("kernel", "eager", end, 5, corr=corr + 1)]
            end += 5
        ev += [_x("cuda_runtime", "cudaMemcpyAsync", host + 45, 2, corr=corr + 2),
               _x("gpu_memcpy", "Memcpy DtoH", end + 10, 8, corr=corr + 2),
               _x("cuda_runtime", "cudaEventQuery", host + 47, 1)]        # no device work, no correlation
        host, dev, corr = host + 500, end + 50 + i, corr + 10
    ev.append({"ph": "i", "name": "marker", "ts": 0})                # not an X event: ignored
    return ev[::-1]                                                   # order must not matter


def test_label_round_trip():
    assert parse_label(block_label(4, 3, 4, 8)) == {"k": 4, "n": 3, "bucket": 4, "units": 8}


def test_blocks_from_trace_matches_kernels_to_their_block_by_correlation():
    blocks, unmatched = blocks_from_trace(_trace())
    assert unmatched == 0
    assert [b["k"] for b in blocks] == [4, 4, 4, 0, 0]
    for i, b in enumerate(blocks):
        kernels = 200 + 10 * i
        assert b["kernel_us"] == pytest.approx(kernels)
        assert b["eager_us"] == pytest.approx(5 if i == 1 else 0)
        assert b["block_us"] == pytest.approx(kernels + 20 + (5 if i == 1 else 0))
        assert not b["prefill_after"] and b["launch_us"] == 40
        if i < 4:
            assert b["gap_us"] == pytest.approx(50 + i)
            assert b["outside_us"] == pytest.approx(8)
            assert b["idle_us"] == pytest.approx(42 + i)
        else:
            assert b["gap_us"] is None and b["idle_us"] is None


def test_unmatched_device_events_are_counted_and_left_outside():
    ev = _trace() + [_x("kernel", "orphan", 50_000, 5, corr=9999)]
    blocks, unmatched = blocks_from_trace(ev)
    assert unmatched == 1 and blocks[-1]["gap_us"] is None


def test_a_prefill_between_blocks_is_flagged():
    ev = _trace() + [_x("user_annotation", PREFILL, 1000 + 500 * 2 + 100, 50)]   # after block 2's range
    blocks, _ = blocks_from_trace(ev)
    assert [b["prefill_after"] for b in blocks] == [False, False, True, False, False]


def test_cpu_trace_has_blocks_without_device_times():
    ev = [e for e in _trace() if e.get("cat") in ("user_annotation", "cuda_runtime")]
    blocks, unmatched = blocks_from_trace(ev)
    assert len(blocks) == 5 and unmatched == 0
    assert all(b["block_us"] is None and b["gap_us"] is None for b in blocks)
    s = summarize(with_expected(blocks, None))
    assert s["steady"] == 0 and s["by_k"] == {} and "share" not in s


def test_expected_and_summary_medians_shares_and_switch():
    blocks, _ = blocks_from_trace(_trace())
    with_expected(blocks, COSTS)
    assert [b["expected_us"] for b in blocks] == [440.0, 440.0, 440.0, 400.0, 400.0]
    s = summarize(blocks, trim=1)                     # steady: blocks 1..3, all with a next block
    assert s["blocks"] == 5 and s["steady"] == 3
    k4, k0 = s["by_k"][4], s["by_k"][0]               # block 1 (next k 4), block 3 (next k 0)
    assert k4["blocks"] == 1 and k0["blocks"] == 1
    assert k4["block_us"] == pytest.approx(235) and k4["kernel_us"] == pytest.approx(210)
    assert k4["eager_us"] == pytest.approx(5) and k4["x"] == pytest.approx(235 / 440)
    assert k4["idle_us"] == pytest.approx(43) and k4["outside_us"] == pytest.approx(8)
    assert k0["expected_us"] == 400.0 and k0["x"] == pytest.approx(250 / 400)
    assert s["switch"]["blocks"] == 1 and s["switch"]["gap_us"] == pytest.approx(52)   # block 2: k 4 -> 0
    sh = s["share"]
    assert sh["window_us"] == pytest.approx(235 + 51 + 240 + 52 + 250 + 53)
    assert sh["expected"] + sh["excess"] + sh["outside"] + sh["idle"] == pytest.approx(1.0)
    assert sh["outside"] == pytest.approx(24 / sh["window_us"])


def test_events_blocks_and_edges():
    marks = [(PREFILL, None, None)] + [(block_label(4, 1, 1, 4), 100.0 * i, 100.0 * i + 80) for i in range(6)]
    blocks = with_expected(blocks_from_events(marks), COSTS)
    assert [b["block_us"] for b in blocks] == [80.0] * 6
    assert [b["gap_us"] for b in blocks] == [20.0] * 5 + [None]
    s = summarize(blocks, wall_us=1160.0)
    assert s["by_k"][4]["gap_us"] == 20.0 and "idle_us" not in s["by_k"][4]
    assert s["share"]["gap"] == pytest.approx(0.2)
    assert s["edges"] == pytest.approx(1 - 580 / 1160)


def test_cost_table_takes_int_or_string_keys():
    assert cost_table(COSTS) == {(1, 0): 100.0, (1, 4): 110.0}
    assert cost_table({"graph_step_us": {1: 5.0}, "graph_round_us": {}}) == {(1, 0): 5.0}
    assert cost_table(None) == {}


def test_table_lists_each_config_and_k():
    blocks, _ = blocks_from_trace(_trace())
    prof = summarize(with_expected(blocks, COSTS), trim=1)
    row = {"spec": "draft=/tmp/fam/draft", "bs": 1, "blocks": {"profiler": prof, "events": {}}}
    out = table([row, {"spec": "none", "bs": 4}])
    assert "draft:1" in out and "none:4" in out and " sw " in out
    assert out.count("draft:1") == 4                  # k = 0, k = 4, the switch, the share row


class _Executor:
    def run(self, block):
        return "spec" if block.k else "plain"


class _Engine:
    caps = SimpleNamespace(config=SimpleNamespace(buckets=(1, 2, 4)), steps_per_graph=8, spec_rounds=4)

    def __init__(self):
        self.runtime = _Executor()

    def _prefill_guarded(self, work):
        return True


def test_marked_blocks_labels_each_launch_and_restores_the_methods():
    import engine_gaps
    eng, seen = _Engine(), []

    @contextlib.contextmanager
    def mark(label):
        seen.append(label)
        yield
    with engine_gaps.marked_blocks(eng, mark):
        assert eng.runtime.run(Block(3)) == "plain"
        assert eng.runtime.run(Block(1, k=2)) == "spec"
        eng.runtime.run(Block(2, k=4, draw=Draw(filtered=True)))
        eng._prefill_guarded([])
    assert seen == [block_label(0, 3, 4, 8), block_label(2, 1, 1, 4), block_label(4, 2, 2, 4), PREFILL]
    assert "run" not in vars(eng.runtime) and "_prefill_guarded" not in vars(eng)


def test_graph_costs_reads_the_policy_rounds():
    import engine_gaps
    from graphrt.speculative.policy import StepCosts
    costs = StepCosts(decode_us={1: 100.0}, verify_us={1: {2: 105.0, 5: 120.0}}, draft_us={1: 10.0})
    llm = SimpleNamespace(engine=SimpleNamespace(policy=SimpleNamespace(graph_costs=costs), runtime=None))
    assert engine_gaps.graph_costs(llm) == {"graph_step_us": {1: 100.0},
                                            "graph_round_us": {1: {1: 115.0, 4: 160.0}}}


def test_cli_help_and_bad_block_tokens():
    tool = DEVICE / "engine_gaps.py"
    r = subprocess.run([sys.executable, str(tool), "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--block-tokens" in r.stdout
    r = subprocess.run([sys.executable, str(tool), "--block-tokens", "-1"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "--block-tokens" in r.stderr
