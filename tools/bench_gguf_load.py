"""GGUF load benchmark: graphrt's torch dequantizer (graphrt/checkpoint/gguf_quants.py) against the
`gguf` package's NumPy one, per GGML type, and a whole GGUF file's load against reading its bytes.

Per type (--types): one random tensor of --rows x --cols weights (raw blocks, fp16 scales finite)
dequantized to float32 by both, best of --repeats: M weights/s of the torch path on the host
(torch's threads: --threads, default torch's) into a fresh tensor and into a buffer written before
(no page faults: what the dequantization itself costs), of the NumPy path (one core, a fresh
array), the speed-up (fresh against fresh), and whether the two agree bit for bit. With --device
cuda also the torch path on the GPU, the raw bytes already there (gpu) and copied from the host
first (h2d+gpu).
Whole file: --gguf FILE, else a synthetic GGUF written to --workdir: --shape's geometry
(tools/make_checkpoint.py's shapes, --layers N to cut it), 2-D weights as random --file-type
blocks, 1-D tensors F32. Each timing runs in a fresh process; "cold" drops the file's pages
from the page cache first (posix_fadvise DONTNEED: this file only). read: the file's bytes read
into memory in 16 MiB pieces, as cat does; load: graphrt.checkpoint's load_checkpoint(file,
device=--device, dtype=--dtype) (config, headers, dequantization, the copy into the fused
weights), split as the Checkpoint reports it into metadata (config_s: the GGUF's metadata parsed
into a config) and tensors (load_s); load / read says how far the load is from disk speed.

    python tools/bench_gguf_load.py                                      # 10 types, synthetic llama-3.2-1b Q4_K
    python tools/bench_gguf_load.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf --types Q4_1,Q8_0
    python tools/bench_gguf_load.py --device cuda --shape llama-3.1-8b --out gguf.json

Prints a table, writes JSON (--out).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
# byte offsets of the fp16 fields (d, m, dmin) in a block: kept finite in random blocks
FP16_FIELDS = {"F16": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
               "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
PIECE = 16 << 20                       # bytes per read() when timing the file read
CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch
from graphrt.checkpoint.loader import load_checkpoint
if int(sys.argv[4]):
    torch.set_num_threads(int(sys.argv[4]))
t0 = time.perf_counter()
ck = load_checkpoint(sys.argv[2], device=sys.argv[3], dtype=getattr(torch, sys.argv[5]))
if ck.device.type == "cuda":
    torch.cuda.synchronize()
print(json.dumps({"load_s": time.perf_counter() - t0, "config_s": ck.config_s, "tensors_s": ck.load_s,
                  "weights": ck.nbytes // 4, "dtype": str(ck.dtype)}))
"""   # a GGUF tensor is read as float32: nbytes / 4 weights


def random_blocks(kind: str, rows: int, cols: int, *, seed: int = 0, fp16_at=None, scale: float = 1.0) -> np.ndarray:
    """Raw GGML blocks of `kind` for a [rows, cols] tensor: uint8 [rows, bytes per row] of random
    bytes whose fp16 fields (fp16_at: byte offsets in a block; default FP16_FIELDS[kind]) hold finite
    values (random bits, exponent below all-ones, times `scale`)."""
    import gguf
    weights, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    if cols % weights:
        raise ValueError(f"cols: {cols} is not whole {kind} blocks of {weights} weights")
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, cols // weights * size), dtype=np.uint8)
    blocks = raw.reshape(-1, size)
    for at in FP16_FIELDS.get(kind, ()) if fp16_at is None else fp16_at:
        bits = rng.integers(0, 1 << 16, blocks.shape[0], dtype=np.uint16)
        bits = np.where((bits & 0x7C00) == 0x7C00, bits & ~np.uint16(0x4000), bits)     # no Inf / NaN
        vals = (bits.view(np.float16) * np.float16(scale)).astype(np.float16)
        blocks[:, at:at + 2] = vals.view(np.uint8).reshape(-1, 2)
    return raw


def _best(fn, repeats: int, sync=lambda: None) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_types(args) -> list[dict]:
    import gguf
    import torch

    from graphrt.checkpoint.gguf_quants import dequantize
    rows = []
    for kind in args.types:
        raw = random_blocks(kind, args.rows, args.cols, seed=1)
        qt = gguf.GGMLQuantizationType[kind]
        n = args.rows * args.cols
        host = torch.from_numpy(raw)
        torch_s = _best(lambda: dequantize(host, kind), args.repeats)
        buf = torch.empty(args.rows, args.cols)                           # written once: no page faults after
        warm_s = _best(lambda: dequantize(host, kind, out=buf), args.repeats)
        numpy_s = _best(lambda: gguf.quants.dequantize(raw, qt), args.repeats)
        same = torch.equal(dequantize(host, kind).view(torch.int32),
                           torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(raw, qt))).view(torch.int32))
        row = {"type": kind, "weights": n, "raw_bytes": raw.nbytes, "torch_host_mws": n / torch_s / 1e6,
               "torch_host_into_mws": n / warm_s / 1e6, "numpy_mws": n / numpy_s / 1e6,
               "speedup": numpy_s / torch_s, "bit_equal": bool(same)}
        if args.device == "cuda":
            sync = torch.cuda.synchronize
            dev = host.cuda()
            row["torch_gpu_mws"] = n / _best(lambda: dequantize(dev, kind), args.repeats, sync) / 1e6
            row["torch_h2d_gpu_mws"] = n / _best(lambda: dequantize(host.cuda(), kind), args.repeats, sync) / 1e6
            del dev
        rows.append(row)
        print(f"  {kind:5s} torch {row['torch_host_mws']:6.0f} (into a buffer {row['torch_host_into_mws']:5.0f})  "
              f"numpy {row['numpy_mws']:5.0f} M weights/s  "
              f"x{row['speedup']:.1f}" + (f"  gpu {row['torch_gpu_mws']:8.0f}" if "torch_gpu_mws" in row else ""),
              flush=True)
    return rows


def write_synthetic(path: Path, shape: str, layers: int | None, kind: str) -> Path:
    """A GGUF of `shape`'s geometry (llama) with random `kind` blocks for every 2-D weight (Q8_0
    where a row is not whole `kind` blocks), written under a temporary name, then renamed."""
    import gguf

    from graphrt.checkpoint.files import expected_tensors
    from graphrt.checkpoint.gguf_tensors import GLOBAL_NAMES, LAYER_NAMES
    from graphrt.model.spec import LlamaSpec
    from make_checkpoint import SHAPES, hf_config
    cfg = hf_config(shape, "llama", SHAPES[shape][6] or 384, "bfloat16", num_layers=layers)   # tiny: 384 ids
    cfg.pop("rope_scaling")
    to_gguf = {hf: g for g, hf in GLOBAL_NAMES.items()} | {hf: g for g, hf in LAYER_NAMES.items()}
    part = path.with_suffix(".part")
    w = gguf.GGUFWriter(str(part), "llama")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    for i, (name, (shape_, _)) in enumerate(expected_tensors(LlamaSpec.from_config(cfg), "llama").items()):
        if name.startswith("model.layers."):
            _, _, layer, rest = name.split(".", 3)
            g = f"blk.{layer}.{to_gguf[rest]}"
        else:
            g = to_gguf[name]
        if len(shape_) == 1:
            w.add_tensor(g, np.ones(shape_, dtype=np.float32))
        else:                                    # rows of partial blocks: Q8_0, as llama.cpp falls back
            k = kind if shape_[1] % gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]][0] == 0 else "Q8_0"
            w.add_tensor(g, random_blocks(k, *shape_, seed=i, scale=1e-3), raw_dtype=gguf.GGMLQuantizationType[k])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    part.rename(path)
    return path


def _drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _read_s(path: Path) -> float:
    buf = bytearray(PIECE)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass
    return time.perf_counter() - t0


def bench_file(args) -> dict:
    path = args.gguf
    if path is None:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
        layers = f"-{args.layers}l" if args.layers else ""
        path = Path(args.workdir) / f"synthetic-{args.shape}{layers}.{args.file_type}.gguf"
        if not path.exists():
            t0 = time.perf_counter()
            write_synthetic(path, args.shape, args.layers, args.file_type)
            print(f"  wrote {path} ({path.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - t0:.0f} s",
                  flush=True)

    def load() -> dict:
        out = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), str(path), args.device, str(args.threads),
                              args.dtype],
                             capture_output=True, text=True, check=False)
        if out.returncode:
            raise SystemExit(f"load_checkpoint failed:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])
    size = path.stat().st_size
    _drop_cache(path)
    read_cold = _read_s(path)
    read_warm = _read_s(path)
    _drop_cache(path)
    cold = load()
    warm = load()
    res = {"file": str(path), "bytes": size, "weights": cold["weights"], "dtype": cold["dtype"],
           "device": args.device, "read_cold_s": read_cold, "read_warm_s": read_warm,
           "read_cold_gbs": size / read_cold / 1e9, "load_cold_s": cold["load_s"], "load_warm_s": warm["load_s"],
           "config_cold_s": cold["config_s"], "config_warm_s": warm["config_s"],
           "tensors_cold_s": cold["tensors_s"], "tensors_warm_s": warm["tensors_s"],
           "load_cold_over_read": cold["load_s"] / read_cold, "tensors_cold_over_read": cold["tensors_s"] / read_cold,
           "tensors_warm_mws": cold["weights"] / warm["tensors_s"] / 1e6}
    return res


def machine(args) -> dict:
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    out = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
           "torch_threads": torch.get_num_threads(), "loadavg_1m": os.getloadavg()[0],
           "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    if args.device == "cuda":
        out["gpu"] = torch.cuda.get_device_name()
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--types", default=",".join(TYPES), help="GGML types, comma-separated ('' for none)")
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=4096, help="a multiple of 256")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                   help="whole file: the weights' dtype (default: bfloat16 on cuda, float32 on cpu, as LLM serves)")
    p.add_argument("--gguf", type=Path, help="the file to load (default: a synthetic one)")
    p.add_argument("--no-file", action="store_true", help="skip the whole-file rows")
    p.add_argument("--shape", default="llama-3.2-1b", help="synthetic file: a tools/make_checkpoint.py shape")
    p.add_argument("--layers", type=int, help="synthetic file: this many layers")
    p.add_argument("--file-type", default="Q4_K", help="synthetic file: the 2-D weights' type")
    p.add_argument("--workdir", default="/tmp/bench_gguf_load")
    p.add_argument("--out", type=Path, help="write the JSON here")
    args = p.parse_args(argv)
    from graphrt.checkpoint.gguf_quants import BLOCKS
    from make_checkpoint import SHAPES
    args.types = [t for t in args.types.split(",") if t]
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    bad = [t for t in args.types + [args.file_type] if t not in BLOCKS or BLOCKS[t][0] == 1]
    if bad:
        p.error(f"--types / --file-type: {bad[0]!r} is not one of {', '.join(TYPES)}")
    if args.rows < 1 or args.cols < 256 or args.cols % 256:
        p.error(f"--rows / --cols: need rows >= 1 and cols a positive multiple of 256, got {args.rows} x {args.cols}")
    if args.repeats < 1 or args.threads < 0:
        p.error("--repeats must be >= 1 and --threads >= 0")
    if args.gguf is not None and not args.gguf.is_file():
        p.error(f"--gguf: {args.gguf} is not a file")
    if args.shape not in SHAPES:
        p.error(f"--shape: {args.shape!r} is not one of {', '.join(SHAPES)}")
    if args.layers is not None and args.layers < 1:
        p.error(f"--layers: expected >= 1, got {args.layers}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    result = {"machine": machine(args)}
    m = result["machine"]
    print(f"{m['cpu']}, {m['cores']} cores, torch {m['torch']} with {m['torch_threads']} threads, "
          f"load average {m['loadavg_1m']:.1f}" + (f", {m['gpu']}" if "gpu" in m else ""))
    if args.types:
        print(f"per type: a {args.rows} x {args.cols} tensor dequantized to float32, best of {args.repeats}")
        result["types"] = bench_types(args)
    if not args.no_file:
        print("whole file:", flush=True)
        f = result["file"] = bench_file(args)
        print(f"  {f['file']}: {f['bytes'] / 1e9:.2f} GB, {f['weights'] / 1e6:.0f} M weights -> {f['dtype']} on "
              f"{f['device']}\n  read cold {f['read_cold_s']:.2f} s ({f['read_cold_gbs']:.2f} GB/s), warm "
              f"{f['read_warm_s']:.2f} s\n  load_checkpoint cold {f['load_cold_s']:.2f} s (metadata "
              f"{f['config_cold_s']:.2f} s, tensors {f['tensors_cold_s']:.2f} s), warm {f['load_warm_s']:.2f} s "
              f"(metadata {f['config_warm_s']:.2f} s, tensors {f['tensors_warm_s']:.2f} s: {f['tensors_warm_mws']:.0f} M weights/s)\n  cold load / read "
              f"{f['load_cold_over_read']:.1f}x, cold tensors / read {f['tensors_cold_over_read']:.1f}x")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
