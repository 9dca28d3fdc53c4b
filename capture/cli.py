"""graphrt-capture: build the graph cache a server starts from, or capture and verify a YAML config.

    graphrt-capture --model /srv/ckpt/llama8b --out cache/llama8b             the cache for graphrt serve
    graphrt-capture --model DIR --out DIR2 --max-num-seqs 8 --max-model-len 4096   ... with serve's flags
    graphrt-capture --config configs/llama-3.1-8b.yaml --out cache/rt8b       a DecodeRuntime cache
    graphrt-capture --check cache/llama8b                                     verify a cache
    graphrt-capture --check cache/llama8b --expect-digest <sha256>            ... and pin it

--model builds the engine exactly as `graphrt serve MODEL` with the same engine flags does,
compiling every kernel into --out, runs warm requests (greedy, sampled, penalties, log-probs,
prompt log-probs, a long prompt), and writes the manifest: the sha256 of every file and what
the cache was built for; `graphrt serve MODEL --graph-cache DIR` with other engine flags or
another model is refused, naming the field (capture/model.py).

--config:
builds every kernel the config needs, captures every bucket (largest first), verifies each
bucket against float32 reference attention at lengths 1, a page boundary and the maximum, times
it (host and device µs per step), records graph memory and capture time, and with `backend: auto`
picks the fastest backend per bucket. Without CUDA it runs the same pipeline eagerly with the
torch split-KV backend (device planner + torch executor), verifies the buckets and lengths that
fit a CPU budget (--verify-buckets / --verify-lengths choose), and says which.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and "(default: X)" after every option that has one;
    options whose default is None say in their help what None means."""

    def _get_help_string(self, action):
        if action.default is None or action.default is argparse.SUPPRESS or action.required \
                or action.default is False:
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    from graphrt import __version__
    from graphrt.config import BACKENDS
    p = argparse.ArgumentParser(prog="graphrt-capture", description=__doc__, formatter_class=_HelpFormatter)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--config", metavar="YAML", help="YAML runtime config (see configs/)")
    what.add_argument("--check", metavar="DIR", help="verify a graph cache against this host's GPU, "
                                                      "versions and files")
    what.add_argument("--model", metavar="DIR|ORG/NAME",
                      help="a checkpoint: build the graph cache `graphrt serve MODEL --graph-cache DIR` starts "
                           "from (needs --out; give it serve's engine flags below)")
    p.add_argument("--out", metavar="DIR", help="write a graph cache here (must be new or empty; "
                                                 "default: none, nothing written)")
    p.add_argument("--device", default="auto", metavar="auto|cpu|cuda|cuda:N",
                   help="where to capture and verify (auto: cuda when available, else cpu, eager)")
    p.add_argument("--backend", default=None, choices=BACKENDS,
                   help="override the config's backend (default: the config's)")
    p.add_argument("--steps", type=int, default=1, metavar="N", help="verification batches per bucket")
    p.add_argument("--json", default=None, metavar="FILE",
                   help="write the per-bucket report here (default: none, the table only)")
    p.add_argument("--verify-buckets", type=_int_list, default=None, metavar="B1,B2,..",
                   help="verify (and time) only these buckets (default: all; a subset on CPU)")
    p.add_argument("--verify-lengths", type=_int_list, default=None, metavar="L1,L2,..",
                   help="request lengths to verify at (default: 1, page, page+1, max; "
                        "max capped on CPU)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar while buckets are captured and verified (default: a bar on stderr)")
    p.add_argument("--expect-digest", metavar="SHA256", default=None,
                   help="with --check: refuse unless manifest.json has this sha256 (default: none, no pin)")
    p.add_argument("--trust-unsafe-permissions", action="store_true",
                   help="accept a cache that other users can write or that another user owns "
                        "(docs/graph-cache.md: Trust model)")
    eng = p.add_argument_group("with --model: graphrt serve's flags that decide which kernels and graphs exist "
                               "(serve the cache with the same ones)")
    eng.add_argument("--engine-config", metavar="YAML", default=None,
                     help="serve's --config file (EngineConfig fields; default: none, the engine's defaults)")
    eng.add_argument("--max-num-seqs", type=int, default=None, metavar="N",
                     help="as serve --max-num-seqs (default: serve's)")
    eng.add_argument("--max-model-len", type=int, default=None, metavar="N",
                     help="as serve --max-model-len (default: serve's)")
    eng.add_argument("--dtype", default=None, choices=("auto", "bfloat16", "float16", "float32"),
                     help="as serve --dtype (default: serve's, auto)")
    eng.add_argument("--kv-cache-dtype", default=None, choices=("auto", "fp8"),
                     help="as serve --kv-cache-dtype (default: serve's, auto)")
    eng.add_argument("--quantization", default=None, choices=("fp8", "int4"),
                     help="as serve --quantization (default: none)")
    eng.add_argument("--speculative-method", default=None, choices=("ngram", "draft", "eagle3"),
                     help="as serve --speculative-method (default: none)")
    eng.add_argument("--draft-model", default=None, metavar="DIR", help="as serve --draft-model (default: none)")
    eng.add_argument("--num-speculative-tokens", type=int, default=None, metavar="K",
                     help="as serve --num-speculative-tokens (default: serve's)")
    eng.add_argument("--mixed-prefill-tokens", type=int, default=None, metavar="N",
                     help="as serve --mixed-prefill-tokens (default: serve's, 0)")
    eng.add_argument("--steps-per-graph", default=None, metavar="K|auto",
                     help="as serve --steps-per-graph (default: serve's, auto)")
    eng.add_argument("--revision", default=None, metavar="REV",
                     help="with a repo id: as serve --revision (default: main)")
    p.add_argument("--version", action="version", version=f"graphrt-capture (graphrt) {__version__}")
    return p


def _flashinfer_ok(backend: str | None, config_path: str) -> bool:
    """False when the run needs FlashInfer (flashinfer*, xqa or auto, given or the config's) and it
    is missing. Reads the config's backend without validating it (load_config does that next)."""
    from graphrt.attention.flashinfer_import import flashinfer_installed
    if flashinfer_installed():
        return True
    if backend is None:
        import yaml

        from graphrt.config import RuntimeConfig
        try:
            backend = (yaml.safe_load(Path(config_path).read_text()) or {}).get("backend", RuntimeConfig.backend)
        except (OSError, yaml.YAMLError, AttributeError):
            return True                               # load_config reports the file itself
    return backend in ("reference", "torch-splitkv", "triton-decode")


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps: must be >= 1 (verification batches per bucket), got {args.steps}")
    if args.device not in ("auto", "cpu") and not args.device.startswith("cuda"):
        parser.error(f"--device: {args.device!r} is not one of auto, cpu, cuda, cuda:N")
    if args.expect_digest is not None and not args.check:
        parser.error("--expect-digest: only with --check DIR")
    from .model import SERVE_FLAGS
    given = [f"--{k.replace('_', '-')}" for k in SERVE_FLAGS if getattr(args, k) is not None]
    if args.model is None and given:
        parser.error(f"{given[0]}: only with --model")
    if args.check:
        return check(Path(args.check), expect_digest=args.expect_digest,
                     trust_unsafe_permissions=args.trust_unsafe_permissions)
    if args.model is not None:
        for name in ("backend", "json", "verify_buckets", "verify_lengths"):
            if getattr(args, name) is not None:
                parser.error(f"--{name.replace('_', '-')}: not with --model (the engine config decides)")
        if not args.out:
            parser.error("--model: needs --out DIR (where the graph cache is written)")
    import torch
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        print(f"graphrt-capture: --device {device}: torch {torch.__version__} sees no CUDA device on "
              f"this host; use --device cpu (eager) or run on a GPU host", file=sys.stderr)
        return 2
    if args.model is not None:
        return _capture_model(args, device)
    if device.startswith("cuda") and not _flashinfer_ok(args.backend, args.config):
        from graphrt.attention.flashinfer_import import install_line
        print(f"graphrt-capture: backend {args.backend or 'of ' + args.config} on CUDA needs FlashInfer, "
              f"which is not installed: {install_line()}", file=sys.stderr)
        return 2
    from graphrt.kernels.triton_import import TritonMissing, require_triton
    try:                                              # the prepare kernel: compiled, or interpreted on a CPU
        require_triton("graphrt-capture (it runs and verifies graphrt's Triton prepare kernel)")
    except TritonMissing as e:
        print(f"graphrt-capture: {e}", file=sys.stderr)
        return 2
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before graphrt imports its kernels
    from graphrt import ConfigError, load_config
    from graphrt.attention.verify import make_plan
    from .cpu import CpuRefusal, check_memory, choose_plan, cpu_backend, plan_summary

    try:
        config = load_config(args.config)
    except ConfigError as e:  # one line naming the file, key and limit; never a traceback
        print(f"graphrt-capture: {e}", file=sys.stderr)
        return 2
    backend, note = args.backend or config.backend, None
    try:
        if device == "cpu":  # decided before anything is allocated or written
            backend, note = cpu_backend(config.backend, args.backend)
            check_memory(config)
            plan = choose_plan(config, buckets=args.verify_buckets, lengths=args.verify_lengths)
        else:
            plan = make_plan(config, buckets=args.verify_buckets, lengths=args.verify_lengths)
    except CpuRefusal as e:
        print(f"graphrt-capture: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # make_plan: "buckets: ..." / "lengths: ..."
        print(f"graphrt-capture: --verify-{e}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else None
    if out is not None:
        if out.exists() and any(out.iterdir()):
            print(f"graphrt-capture: --out {out} exists and is not empty", file=sys.stderr)
            return 2
        make_private_dirs(out)
    from contextlib import nullcontext

    from graphrt.cache.load import compilers_at
    from graphrt.attention.verify import TOLERANCE
    from .build import build

    if note:
        print(note)
    full = plan.is_full(config)
    if not full:
        print(f"graphrt-capture: verifying buckets {list(plan.buckets)} of {len(config.buckets)} "
              f"with lengths {list(plan.lengths)}")
    # FlashInfer JIT + Triton build into the cache (set before any compile, restored after)
    with compilers_at(out) if out is not None else nullcontext():
        rt, rows, setup_s = build(config, torch.device(device), backend=backend, steps=args.steps,
                                  progress=not args.no_progress, out_dir=out, plan=plan)
    tol = TOLERANCE[config.dtype]
    failed = [r["bucket"] for r in rows if r["rel_err"] is not None and not r["rel_err"] <= tol]
    print_table(config, args.config, rt, rows, setup_s, tol)
    if args.json:
        mode = "CUDA graphs" if rt.uses_graphs else "eager"
        Path(args.json).write_text(json.dumps({"config": config.to_dict(), "mode": mode, "rows": rows},
                                              indent=1))
    if out is not None and not failed:
        status = check(out, trust_unsafe_permissions=args.trust_unsafe_permissions)
        if status:
            return status
        print(f"graph cache written to {out} (load: DecodeRuntime.from_cache({str(out)!r}, "
              f"kv_cache=..., expect_digest=<the manifest sha256 above>))")
    if failed:
        print(f"FAILED verification: buckets {failed} above tolerance {tol:g}", file=sys.stderr)
        return 1
    if any(r["backend"] == "reference" for r in rows):
        print("note: buckets on the 'reference' backend are the oracle itself (their error is a "
              "self-check); use torch-splitkv on a CPU to verify the device planner")
    if full:
        print("all buckets verified against the float32 reference")
    else:
        print(plan_summary(config, plan, on_cpu=device == "cpu", config_path=args.config))
    return 0


def _capture_model(args, device: str) -> int:
    """--model: the server's cache (capture/model.py), then the check and the digest to pin."""
    from graphrt.attention.flashinfer_import import flashinfer_installed, install_line
    if device.startswith("cuda") and not flashinfer_installed():
        print(f"graphrt-capture: --model on CUDA needs FlashInfer, which is not installed: {install_line()}",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        print(f"graphrt-capture: --out {out} exists and is not empty", file=sys.stderr)
        return 2
    from .model import capture_model, serve_hint
    make_private_dirs(out)
    status = capture_model(args, device, out)
    if status == 0:
        status = check(out, trust_unsafe_permissions=args.trust_unsafe_permissions)
    if status == 0:
        print(serve_hint(args, out))
    return status


def make_private_dirs(path: Path) -> None:
    """mkdir -p with every folder it creates owner-only (0700, whatever the umask): the cache
    check refuses group/other-writable folders above a cache, so parents made with umask 002
    would make graphrt-capture refuse the cache it just built. Existing folders are untouched."""
    missing = []
    p = path.absolute()
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir(mode=0o700, exist_ok=True)
        os.chmod(d, 0o700)                  # mkdir's mode is filtered by the umask


def print_table(config, path, rt, rows, setup_s, tol) -> None:
    mode = "CUDA graphs" if rt.uses_graphs else "eager"
    print(f"\nconfig {config.name} ({path}) | {mode} on {rt.device} | setup+capture {setup_s:.2f} s "
          f"| tolerance {tol:g}")
    print(f"{'bucket':>6} {'backend':<22} {'capture ms':>10} {'graph MB':>9} {'buffers KB':>10} "
          f"{'host us':>8} {'device us':>9} {'rel err':>9}")
    for r in rows:
        cap = f"{r['capture_ms']:.1f}" if r["capture_ms"] is not None else "-"
        mb = f"{r['graph_bytes'] / 2**20:.2f}" if r["graph_bytes"] is not None else "-"
        dev = f"{r['device_us']:.1f}" if r["device_us"] is not None else "-"
        host = f"{r['host_us']:.1f}" if r["host_us"] is not None else "-"
        err = f"{r['rel_err']:.2e}" if r["rel_err"] is not None else "unverified"
        print(f"{r['bucket']:>6} {r['backend']:<22} {cap:>10} {mb:>9} {r['buffer_bytes'] / 1024:>10.1f} "
              f"{host:>8} {dev:>9} {err:>9}")
    total_graph = sum(r["graph_bytes"] or 0 for r in rows)
    print(f"graph memory, all buckets: {total_graph / 2**20:.2f} MB; static buffers: "
          f"{rt.buffers.nbytes() / 2**20:.2f} MB")


def check(cache_dir: Path, *, expect_digest: str | None = None,
          trust_unsafe_permissions: bool = False) -> int:
    """graphrt-capture --check: one line of verdict, then the manifest sha256 to pin."""
    from graphrt.cache.load import CacheMismatchError, check_cache
    try:
        m = check_cache(cache_dir, expect_digest=expect_digest,
                        trust_unsafe_permissions=trust_unsafe_permissions)
    except (CacheMismatchError, ValueError) as e:
        lines = [line.strip().removeprefix("- ") for line in str(e).splitlines() if line.strip()]
        print(f"graphrt-capture --check: {'; '.join(lines)}", file=sys.stderr)
        return 1
    d = m.data
    print(f"graph cache {cache_dir}: OK | config {d['config'].get('name')} ({d['config_digest']}) | "
          f"{len(d['buckets'])} buckets | {len(d['artifacts'])} artifacts | built {d['created']} "
          f"on {d['environment']['gpu'] or 'a CPU (eager)'}")
    print(f"manifest sha256 {m.digest}  (pin it: from_cache(..., expect_digest=...) or "
          f"--check DIR --expect-digest ...)")
    return 0
