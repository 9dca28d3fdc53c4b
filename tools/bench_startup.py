"""Start-up benchmark: `LLM()` and `graphrt serve` ready times, and the attention runtime's
cold start vs a graph cache. Every start runs in a fresh subprocess.

LLM rows (--what llm): a random checkpoint per shape (tools/make_checkpoint.py, tensors drawn on
the GPU, a 128k-token tokenizer.json of Llama 3's size), written once under --workdir:
  cold   empty Triton and FlashInfer caches (TRITON_CACHE_DIR, FLASHINFER_WORKSPACE_BASE: fresh
         folders): every kernel compiled, every graph captured
  warm   the same folders after the cold start (kernel caches present; a priming start fills them
         first when no cold row ran), the checkpoint read once just before (page cache)
Each row: seconds from spawning the process to `LLM()` returning (ready_s), of which the
imports before it, the StartupTimes split (graphrt/engine/startup.py: imports + checks,
weights (config.json, tensors), runtime + KV pool, kernels, graphs per phase, engine
(tokenizer)), the first generate's seconds, Triton specializations loaded or compiled in the
process (and their seconds), new Triton cache entries (= kernels compiled) and new FlashInfer
files.
Serve row (--what serve): `graphrt serve` on the largest shape, warm caches, seconds from spawn
to /health answering 200; skipped with a note where fastapi / uvicorn are missing.
Runtime rows (--what runtime, the default): the attention DecodeRuntime from a YAML config:
  cold / warm (DecodeRuntime.from_cache(DIR)) / lazy (from_cache(DIR, lazy=True)) /
  warm-preimported (FlashInfer imported first with FLASHINFER_WORKSPACE_BASE=DIR/flashinfer)

    python tools/bench_startup.py --what llm,serve --shapes llama-3.2-1b,llama-3.1-8b --workdir /tmp/gs
    python tools/bench_startup.py --config configs/llama-3.1-8b.yaml --cache /tmp/gc   # runtime rows
    python tools/bench_startup.py --what llm --shapes tiny --device cpu --workdir /tmp/gs   # CPU smoke

Prints a table, writes JSON (--out).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

T0 = time.perf_counter()
ROOT = Path(__file__).resolve().parent.parent
SHAPES = {"1b": "llama-3.2-1b", "8b": "llama-3.1-8b"}      # short names accepted by --shapes
TOKENIZER_VOCAB = 128000                                    # Llama 3's regular tokens


# ---- runtime rows (the attention DecodeRuntime) ---------------------------------------------
def runtime_child(mode: str, config_path: str, cache: str) -> dict:
    """One start in this (fresh) process; times are seconds since process start, except that
    warm-preimported counts ready/first replay from the from_cache call (the engine has already
    paid for importing torch and FlashInfer)."""
    if mode == "cold":
        os.environ["FLASHINFER_WORKSPACE_BASE"] = tempfile.mkdtemp(prefix="fi-cold-")
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cold-")
    if mode == "warm-preimported":
        os.environ["FLASHINFER_WORKSPACE_BASE"] = str((Path(cache) / "flashinfer").resolve())
        from graphrt.attention.flashinfer_import import import_flashinfer   # as the engine imports it
        import_flashinfer("warm-preimported", "flashinfer.decode")
        import_flashinfer("warm-preimported", "flashinfer.prefill")
    import torch

    from graphrt import DecodeRuntime, PagedKVCache, load_config
    from graphrt.attention.reference import reference_decode
    from graphrt.attention.verify import random_batch, rel_error
    t_import = time.perf_counter() - T0
    config = load_config(config_path)
    kv = PagedKVCache.allocate(config, 1024, "cuda")
    torch.cuda.synchronize()
    t_kv = time.perf_counter() - T0
    origin = t_kv if mode == "warm-preimported" else 0.0
    if mode == "cold":
        rt = DecodeRuntime(config, kv, "cuda")
        rt.capture()
    else:
        rt = DecodeRuntime.from_cache(cache, kv_cache=kv, device="cuda", lazy=mode == "lazy")
    t_ready = time.perf_counter() - T0
    q, table, lens = random_batch(rt, 1, [1000], torch.Generator().manual_seed(0))
    out = rt.decode(q, table, lens)
    torch.cuda.synchronize()
    t_first = time.perf_counter() - T0
    k, v = kv.as_tuple()
    err = rel_error(out, reference_decode(q, k, v, table, lens))
    captured = len(rt.graphs.stats) if rt.graphs else 0
    kv_s = 0.0 if mode == "warm-preimported" else t_kv - t_import
    return {"mode": mode, "import_s": t_import, "kv_alloc_s": t_kv - t_import,
            "ready_s": t_ready - origin, "first_replay_s": t_first - origin,
            "to_first_replay_excl_kv_alloc_s": t_first - origin - kv_s,
            "buckets_captured": captured, "rel_err": err, "breakdown_s": rt.startup_s}


def runtime_rows(args) -> list[dict]:
    cache = Path(args.cache)
    if not (cache / "manifest.json").is_file():
        subprocess.run([sys.executable, "-m", "capture", "--config", args.config, "--out", str(cache),
                        "--no-progress"], check=True, cwd=ROOT)
    rows = []
    for mode in args.modes.split(","):
        rows.append(_child_result([sys.executable, __file__, "--child", f"runtime:{mode}", "--config",
                                   args.config, "--cache", str(cache)], os.environ.copy(), mode))
    return rows


def print_runtime(rows) -> None:
    print(f"{'mode':<6} {'import s':>8} {'ready s':>8} {'1st replay s':>12} {'excl. KV alloc':>14} "
          f"{'captured':>8} {'rel err':>8}")
    for r in rows:
        print(f"{r['mode']:<6} {r['import_s']:>8.2f} {r['ready_s']:>8.2f} {r['first_replay_s']:>12.2f} "
              f"{r['to_first_replay_excl_kv_alloc_s']:>14.2f} {r['buckets_captured']:>8} {r['rel_err']:>8.1e}"
              f"  {({k: round(v, 2) for k, v in r['breakdown_s'].items()})}")


# ---- LLM rows --------------------------------------------------------------------------------
class _TritonCount:
    """Triton specializations this process loads or compiles (JIT cache misses) and their
    seconds, through triton.knobs' JIT hooks where this Triton has them."""

    def __init__(self):
        self.n, self.s, self._t, self.ok = 0, 0.0, {}, False
        try:
            from triton import knobs
        except ImportError:
            return
        rt = getattr(knobs, "runtime", None)
        if rt is None or not hasattr(rt, "jit_cache_hook"):
            return
        rt.jit_cache_hook, rt.jit_post_compile_hook, self.ok = self._pre, self._post, True

    def _pre(self, *, key=None, **_):
        self._t[str(key)] = time.perf_counter()
        return False                                  # compile (or load): do not skip

    def _post(self, *, key=None, **_):
        self.n += 1
        self.s += time.perf_counter() - self._t.pop(str(key), time.perf_counter())
        return False


def _entries(d: str | None) -> int:
    """Files under d (0 if absent): kernels a start compiled = the growth of its cache."""
    if not d or not Path(d).is_dir():
        return 0
    return sum(len(files) for _, _, files in os.walk(d))


def llm_child(ckpt: str, device: str, max_batch: int, t_spawn: float, first_tokens: int) -> dict:
    """One LLM() start in this fresh process (the caches come from the environment)."""
    t_proc = time.time()
    triton_dir, fi_dir = os.environ.get("TRITON_CACHE_DIR"), os.environ.get("FLASHINFER_WORKSPACE_BASE")
    before = (_entries(triton_dir), _entries(fi_dir))
    import torch  # noqa: F401
    t_torch = time.perf_counter() - T0
    from graphrt import LLM, SamplingParams
    count = _TritonCount() if device == "cuda" else None
    t_import = time.perf_counter() - T0
    llm = LLM(ckpt, device=device, max_batch=max_batch)
    ready = time.time()
    t, tokens = time.perf_counter(), 0
    if first_tokens:
        out = llm.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=first_tokens, temperature=0.0), use_tqdm=False)
        tokens = len(out[0].token_ids)
    first_s = time.perf_counter() - t
    return {"interpreter_s": t_proc - t_spawn, "torch_import_s": t_torch, "graphrt_import_s": t_import - t_torch,
            "ready_s": ready - t_spawn, "first_generate_s": first_s, "tokens": tokens,
            "startup": llm.startup.as_dict(), "kv_pages": llm.engine.scheduler.allocator.num_pages,
            "triton_specializations": count.n if count and count.ok else None,
            "triton_specialize_s": count.s if count and count.ok else None,
            "triton_compiled": _entries(triton_dir) - before[0], "flashinfer_new_files": _entries(fi_dir) - before[1]}


def make_checkpoint(workdir: Path, shape: str, device: str) -> tuple[Path, float]:
    """The shape's random checkpoint under workdir (written once; the 128k tokenizer built once
    and copied to the other shapes) -> (path, seconds writing it)."""
    path = workdir / f"ckpt-{shape}"
    if (path / ".complete").is_file():
        return path, 0.0
    t = time.perf_counter()
    cmd = [sys.executable, str(ROOT / "tools" / "make_checkpoint.py"), str(path), "--shape", shape,
           "--device", device if shape != "tiny" else "cpu"]
    if shape == "tiny":
        cmd += ["--dtype", "float32"]
    else:
        done = [d for d in sorted(workdir.glob("ckpt-*")) if (d / ".complete").is_file() and d.name != "ckpt-tiny"]
        cmd += ["--tokenizer-from", str(done[0])] if done else ["--tokenizer-vocab", str(TOKENIZER_VOCAB)]
    subprocess.run(cmd, check=True, cwd=ROOT, env=_env())
    (path / ".complete").write_text("")
    return path, time.perf_counter() - t


def read_once(path: Path) -> float:
    """Read every file of the checkpoint (so its bytes are in the page cache) -> seconds."""
    t = time.perf_counter()
    for f in sorted(path.iterdir()):
        if f.is_file():
            with open(f, "rb") as fh:
                while fh.read(64 << 20):
                    pass
    return time.perf_counter() - t


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(extra)
    return env


def _child_result(cmd, env, what: str, timeout_s: float = 900) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout_s)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not line:
        print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"{what} start failed (rc {proc.returncode})")
    return json.loads(line[0][7:])


def llm_rows(args, workdir: Path) -> list[dict]:
    rows = []
    for shape in args.shapes:
        ckpt, write_s = make_checkpoint(workdir, shape, args.device)
        caches = {"TRITON_CACHE_DIR": str(workdir / f"triton-{shape}"),
                  "FLASHINFER_WORKSPACE_BASE": str(workdir / f"flashinfer-{shape}")}
        modes = args.llm_modes
        page_s = read_once(ckpt)                         # in the page cache from here on (RAM permitting)
        for mode in (["prime"] if "cold" not in modes else []) + modes:
            if mode in ("cold", "prime"):
                for d in caches.values():                # fresh, empty kernel caches
                    subprocess.run(["rm", "-rf", d], check=True)
                    Path(d).mkdir(parents=True)
            cmd = [sys.executable, __file__, "--child", "llm", "--ckpt", str(ckpt), "--device", args.device,
                   "--max-batch", str(args.max_batch), "--first-tokens", str(args.first_tokens),
                   "--spawned", repr(time.time())]
            r = _child_result(cmd, _env(**caches), f"LLM {shape} {mode}")
            if mode != "prime":
                rows.append({"row": f"LLM {shape}", "mode": mode, "checkpoint_write_s": write_s,
                             "page_cache_read_s": page_s, **r})
    return rows


def serve_row(args, workdir: Path) -> dict:
    """graphrt serve on the last shape with its warm caches: seconds to /health 200."""
    shape = args.shapes[-1]
    row = {"row": f"serve {shape}", "mode": "warm"}
    missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        return {**row, "skipped": f"{' and '.join(missing)} not installed (pip install 'graphrt[serve]')"}
    ckpt, _ = make_checkpoint(workdir, shape, args.device)
    caches = {"TRITON_CACHE_DIR": str(workdir / f"triton-{shape}"),
              "FLASHINFER_WORKSPACE_BASE": str(workdir / f"flashinfer-{shape}")}
    if not Path(caches["TRITON_CACHE_DIR"]).is_dir():
        return {**row, "skipped": "no LLM row of this shape ran first (its kernel caches are what serve reuses)"}
    with socket.socket() as s:                         # a free port on the loopback
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "graphrt.serve", str(ckpt), "--host", "127.0.0.1", "--port", str(port),
           "--device", args.device, "--max-num-seqs", str(args.max_batch), "--stats-interval", "0"]
    t_spawn = time.perf_counter()
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(**caches), stdout=log, stderr=subprocess.STDOUT, text=True)
    ready = None
    try:
        while proc.poll() is None and time.perf_counter() - t_spawn < 600:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as resp:
                    if resp.status == 200:
                        ready = time.perf_counter() - t_spawn
                        break
            except OSError:
                time.sleep(0.05)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    log.seek(0)
    lines = log.read().splitlines()
    if ready is None:
        print("\n".join(lines[-40:]), file=sys.stderr)
        raise SystemExit(f"serve {shape}: not ready (rc {proc.returncode})")
    split = [x[x.index("startup: "):] for x in lines if "startup: ready in" in x]
    return {**row, "ready_s": ready, "startup_line": split[0] if split else None}


def print_llm(rows) -> None:
    print(f"{'row':<22} {'mode':<5} {'ready s':>7} {'torch':>6} {'graphrt':>7} {'setup':>6} {'config':>6} "
          f"{'tensors':>7} {'weights':>7} {'runtime':>7} {'kernels':>7} {'graphs':>6} {'tokenzr':>7} "
          f"{'engine':>6} {'other':>6} {'1st gen':>7} {'triton spec/s':>13} {'compiled':>8}  graphs by phase")
    for r in rows:
        if "skipped" in r:
            print(f"{r['row']:<22} {r['mode']:<5} skipped: {r['skipped']}")
            continue
        if "startup" not in r:
            print(f"{r['row']:<22} {r['mode']:<5} {r['ready_s']:>7.2f}  {r.get('startup_line')}")
            continue
        s = r["startup"]
        spec = ("-" if r["triton_specializations"] is None else
                f"{r['triton_specializations']}/{r['triton_specialize_s']:.1f}")
        print(f"{r['row']:<22} {r['mode']:<5} {r['ready_s']:>7.2f} {r['torch_import_s']:>6.2f} "
              f"{r['graphrt_import_s']:>7.2f} {s['setup_s']:>6.2f} {s['config_s']:>6.2f} {s['read_s']:>7.2f} "
              f"{s['weights_s']:>7.2f} {s['runtime_s']:>7.2f} {s['kernels_s']:>7.2f} {s['graphs_s']:>6.2f} "
              f"{s['tokenizer_s']:>7.2f} {s['engine_s']:>6.2f} {s['other_s']:>6.2f} {r['first_generate_s']:>7.2f} "
              f"{spec:>13} {r['triton_compiled']:>8}  {s['graphs_by_phase']}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--what", default="runtime", help="comma list of runtime, llm, serve")
    p.add_argument("--config", default="configs/llama-3.1-8b.yaml", help="runtime rows: the YAML config")
    p.add_argument("--cache", default="graph-cache/llama-3.1-8b", help="runtime rows: the graph cache")
    p.add_argument("--modes", default="cold,warm,lazy,warm-preimported", help="runtime rows' modes")
    p.add_argument("--shapes", default="llama-3.2-1b,llama-3.1-8b",
                   help="LLM rows: make_checkpoint shapes (1b, 8b, tiny, ...); serve runs the last")
    p.add_argument("--llm-modes", default="cold,warm", help="LLM rows: cold and / or warm")
    p.add_argument("--workdir", default=None, help="LLM rows: checkpoints and kernel caches (default: a temp dir)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="LLM / serve rows")
    p.add_argument("--max-batch", type=int, default=16, help="LLM / serve rows: max_batch")
    p.add_argument("--first-tokens", type=int, default=8,
                   help="LLM rows: tokens of the first generate timed after ready (0: none)")
    p.add_argument("--out", default="bench_startup.json")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--ckpt", default=None, help=argparse.SUPPRESS)
    p.add_argument("--spawned", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child == "llm":
        print("RESULT " + json.dumps(llm_child(args.ckpt, args.device, args.max_batch, args.spawned,
                                                    args.first_tokens)))
        return 0
    if args.child:
        print("RESULT " + json.dumps(runtime_child(args.child.split(":", 1)[1], args.config, args.cache)))
        return 0
    what = args.what.split(",")
    if unknown := set(what) - {"runtime", "llm", "serve"}:
        p.error(f"--what: unknown {sorted(unknown)}; choose among runtime, llm, serve")
    args.shapes = [SHAPES.get(s, s) for s in args.shapes.split(",")]
    args.llm_modes = args.llm_modes.split(",")
    if unknown := set(args.llm_modes) - {"cold", "warm"}:
        p.error(f"--llm-modes: unknown {sorted(unknown)}; choose among cold, warm")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-startup-"))
    workdir.mkdir(parents=True, exist_ok=True)
    out = {}
    if "runtime" in what:
        out["runtime"] = runtime_rows(args)
        print_runtime(out["runtime"])
    if "llm" in what or "serve" in what:
        t = time.perf_counter()
        out["llm"] = llm_rows(args, workdir) if "llm" in what else []
        if "serve" in what:
            out["llm"].append(serve_row(args, workdir))
        print_llm(out["llm"])
        print(f"LLM / serve rows: {time.perf_counter() - t:.0f} s wall (checkpoints and caches in {workdir})")
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
