"""EAGLE-3 through LLM on the GPU, per prompt length: TTFT, decode time, and the Triton kernels
compiled while serving (new entries in Triton's cache), against the same LLM without speculation;
then one generate under torch.profiler (host ops by CPU time). The target: 8B-shaped, 2 layers,
repeating (tests/_checkpoints.write, lm_head_from_embed, residual_scale 0.1) with a random repeat
head (tests/_eagle3_heads.py), as the EAGLE-3 GPU tests use.
    python tools/device/eagle3_lengths.py --dir /tmp/e3 --out /tmp/e3/lengths.json"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]


class _Dirs:                                  # the tmp_path_factory the test helpers take
    def __init__(self, root: Path):
        self.root = root

    def mktemp(self, name: str) -> Path:
        d = self.root / name
        d.mkdir(parents=True, exist_ok=True)
        return d


def cache_entries() -> set:
    root = Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache"))
    return {p.name for p in root.glob("*/*.json") if not p.name.startswith("__grp__")} if root.is_dir() else set()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/e3")
    ap.add_argument("--out")
    ap.add_argument("--lengths", default="130,167,204,241,278,315,352,389")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", default="llama-3.1-8b", help="tiny for a CPU smoke run")
    a = ap.parse_args()
    import torch
    from _checkpoints import write
    from _eagle3_heads import write_random_head
    from graphrt import LLM, SamplingParams
    d = _Dirs(Path(a.dir))
    path = write(d, "target", shape=a.shape, arch="llama", num_layers=2,
                 dtype="bfloat16" if a.device == "cuda" else "float32", max_shard_mb=1024, tokenizer_vocab=4096, lm_head_from_embed=True, residual_scale=0.1)
    head = write_random_head(path, d.mktemp("head") / "h", repeat=True, intermediate=1024,
                             dtype=torch.bfloat16 if a.device == "cuda" else torch.float32)
    print(json.dumps({"target": str(path), "head": str(head)}), flush=True)
    args = dict(device=a.device, max_batch=4, max_model_len=1024 if a.device == "cuda" else 240)
    gen = torch.Generator().manual_seed(0)
    lengths = [int(x) for x in a.lengths.split(",")]
    prompts = {n: torch.randint(2, 4000 if a.device == "cuda" else 300, (n,), generator=gen).tolist() for n in lengths}
    rows = []
    for method in ("none", "eagle3"):
        spec = {} if method == "none" else {"speculative": {"method": "eagle3", "num_tokens": 4, "model": str(head)}}
        llm = LLM(str(path), **args, **spec)
        try:
            llm.generate([prompts[lengths[0]][:100]], SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)
            for n in lengths:
                before = cache_entries()
                t0 = time.perf_counter()
                llm.generate([prompts[n]], SamplingParams(max_tokens=1, temperature=0, ignore_eos=True), use_tqdm=False)
                ttft = time.perf_counter() - t0
                new = sorted(cache_entries() - before)
                t0 = time.perf_counter()
                out = llm.generate([prompts[n] + [7]], SamplingParams(max_tokens=a.tokens, temperature=0, ignore_eos=True),
                                   use_tqdm=False)
                total = time.perf_counter() - t0
                new2 = sorted(cache_entries() - before - set(new))
                row = {"method": method, "len": n, "ttft_ms": ttft * 1e3, "gen_ms": total * 1e3,
                       "us_per_token": total * 1e6 / len(out[0].token_ids), "compiled_ttft": new, "compiled_gen": new2}
                rows.append(row)
                print(json.dumps(row), flush=True)
            st = llm.engine.stats()
            print(json.dumps({k: v for k, v in st.items() if k.startswith("spec")}), flush=True)
            if method == "eagle3":
                from torch.profiler import ProfilerActivity, profile
                p = SamplingParams(max_tokens=a.tokens, temperature=0, ignore_eos=True)
                with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if a.device == "cuda" else [])) as prof:
                    llm.generate([prompts[lengths[-1]] + [9, 9]], p, use_tqdm=False)
                print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=30), flush=True)
        finally:
            llm.shutdown()
            del llm
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
