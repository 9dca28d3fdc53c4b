"""Does a CUDA graph run slower when its launch is issued late? A synthetic test of the engine's
cadence, with no model: a graph of N small kernels (in-place adds on a bf16 vector of E elements),
replayed

  * "b2b": back to back (the capture-time measurement: the host is far ahead of the device);
  * "engine": as the engine does (launch block i + 1, then wait for block i's event, then
    `--host-us` of host work, then launch again): the launch of i + 1 is issued while i runs;
  * "engine-alt": the same cadence over two graph executables of identical content, alternated
    (whether re-launching the *same* executable while it runs is what costs);
  * "depth2": two blocks in flight (launch i + 2 before waiting for i).

Per mode: the device time of each replay (CUDA events recorded right before and after it, median
over the replays after the first few), the host time spent inside `replay()` (median), and the
device time per replay over the whole loop (wall of the events / replays). Also: the host time of
one `replay()` against the number of nodes with the device idle (the launch call's own cost), and
whether `replay()` releases the GIL (a Python thread counting while the main thread replays).

    python tools/device/launch_cadence.py --out $OUT/launch_cadence.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import torch


def make_graph(nodes: int, elems: int, stream) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """A captured graph of `nodes` in-place adds on a [elems] bf16 vector (cuda)."""
    x = torch.zeros(elems, device="cuda", dtype=torch.bfloat16)
    with torch.cuda.stream(stream):
        for _ in range(3):
            x.add_(1.0)                                  # warm the kernel outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        for _ in range(nodes):
            x.add_(1.0)
    torch.cuda.synchronize()
    return g, x


def spin(us: float) -> None:
    """Busy host work for `us` microseconds (as the engine's Python would be: holding the GIL)."""
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def run_mode(graphs: list, mode: str, reps: int, host_us: float) -> dict:
    """Replay per `mode` -> device us per replay (events), host us inside replay(), loop wall."""
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    launch_us = []
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    depth = {"b2b": None, "engine": 1, "engine-alt": 1, "depth2": 2}[mode]
    for i in range(reps):
        g = graphs[i % len(graphs)] if mode == "engine-alt" else graphs[0]
        ev[i][0].record()
        a = time.perf_counter()
        g.replay()
        launch_us.append((time.perf_counter() - a) * 1e6)
        ev[i][1].record()
        if depth is not None and i - depth >= 0:
            ev[i - depth][1].synchronize()               # the engine reads block i - depth
            spin(host_us)                                # ... and processes it
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e6 / reps
    dev = [ev[i][0].elapsed_time(ev[i][1]) * 1e3 for i in range(5, reps)]
    gaps = [ev[i][1].elapsed_time(ev[i + 1][0]) * 1e3 for i in range(5, reps - 1)]
    return {"device_us": statistics.median(dev), "device_us_p90": sorted(dev)[int(0.9 * len(dev))],
            "idle_between_us": statistics.median(gaps), "launch_us": statistics.median(launch_us[5:]),
            "wall_us_per_replay": wall}


def launch_cost(nodes_list: list[int], elems: int, stream) -> list[dict]:
    """Host us of one replay() with the device idle, per node count (median of 20)."""
    rows = []
    for n in nodes_list:
        g, _ = make_graph(n, elems, stream)
        t = []
        for _ in range(20):
            torch.cuda.synchronize()
            a = time.perf_counter()
            g.replay()
            t.append((time.perf_counter() - a) * 1e6)
        torch.cuda.synchronize()
        rows.append({"nodes": n, "launch_us_idle": statistics.median(t), "per_node_us": statistics.median(t) / n})
    return rows


def gil_released(g) -> dict:
    """Counts a Python thread makes while the main thread is inside replay() (0: the GIL is held)."""
    stop = threading.Event()
    count = [0]

    def counter():
        while not stop.is_set():
            count[0] += 1
    th = threading.Thread(target=counter, daemon=True)
    torch.cuda.synchronize()
    th.start()
    time.sleep(0.01)
    inside = []
    for _ in range(10):
        torch.cuda.synchronize()
        c0 = count[0]
        a = time.perf_counter()
        g.replay()
        inside.append(((time.perf_counter() - a) * 1e6, count[0] - c0))
    stop.set()
    th.join()
    torch.cuda.synchronize()
    return {"replay_us_and_thread_counts": inside}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="200,700,1500")
    ap.add_argument("--elems", default="4096,1048576", help="vector sizes: tiny kernels, ~3 us kernels")
    ap.add_argument("--host-us", default="0,300,900")
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    stream = torch.cuda.Stream()
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "launch_cost": launch_cost([100, 400, 1000, 2000, 4000], 4096, stream), "modes": []}
    print("launch call, device idle:", *(f"{r['nodes']} nodes {r['launch_us_idle']:.0f} us" for r in res["launch_cost"]))
    hdr = f"{'elems':>8} {'nodes':>6} {'host_us':>7} {'mode':>10} {'dev_us':>8} {'p90':>8} {'idle':>6} {'launch':>7} {'wall':>8}"
    print(hdr)
    with torch.cuda.stream(stream):
        for elems in (int(e) for e in a.elems.split(",")):
            for nodes in (int(n) for n in a.nodes.split(",")):
                graphs = [make_graph(nodes, elems, stream)[0] for _ in range(2)]
                for host_us in (float(h) for h in a.host_us.split(",")):
                    for mode in ("b2b", "engine", "engine-alt", "depth2"):
                        if mode == "b2b" and host_us != 0:
                            continue
                        r = run_mode(graphs, mode, a.reps, host_us)
                        r.update(elems=elems, nodes=nodes, host_us=host_us, mode=mode)
                        res["modes"].append(r)
                        print(f"{elems:>8} {nodes:>6} {host_us:>7.0f} {mode:>10} {r['device_us']:>8.1f} "
                              f"{r['device_us_p90']:>8.1f} {r['idle_between_us']:>6.1f} {r['launch_us']:>7.1f} "
                              f"{r['wall_us_per_replay']:>8.1f}", flush=True)
        res["gil"] = gil_released(make_graph(1000, 4096, stream)[0])
    print("GIL while in replay() (us, thread counts):", res["gil"]["replay_us_and_thread_counts"][:5])
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
