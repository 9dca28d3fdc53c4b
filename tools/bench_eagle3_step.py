"""Cost of an EAGLE-3 head step in the Llama-3.1-8B shape vs its weight-bytes floor (CUDA).

    python tools/bench_eagle3_step.py [--batch 1,4] [--context 1024] [--k 4] [--json OUT.json]
                                      [--profile "chain step,extend"]

Writes a head with random weights in the public original layout (config.json as the public
Llama-3.1-8B heads: hidden 4096, 32/8 heads, intermediate 14336, vocabulary 128256, draft
vocabulary 32000, float16, d2t/t2d), loads it through graphrt's loader (bf16), and times, each
as one captured CUDA graph replayed: a chain step (no fc; the decode attention kernel at the
drafter's MAX_SPLITS), a draft-extend over k + 1 tokens (multi-query attention), and
a whole round (draft-extend + k - 1 chain steps), at each batch size with every row holding
--context tokens. Floor of a call = bytes it must read (the weights it uses, plus the K/V it
attends to) / the measured device copy bandwidth; ratio = time / floor. Prints a table, --json
writes it; --profile adds a per-kernel table (torch.profiler over replays) of the calls named.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPE = dict(hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128, vocab=128256, draft_vocab=32000,
             layers=32)


def write_random_head(path: Path, *, shape: dict = SHAPE, device="cuda", seed: int = 0) -> Path:
    """A random head in the public original layout (float16), built on `device`."""
    from graphrt.speculative.eagle3.checkpoint import write_head
    s, dev = shape, device
    g = torch.Generator(device=dev).manual_seed(seed)
    h, i, d = s["hidden"], s["intermediate"], s["head_dim"]
    r = lambda *shape: (torch.randn(shape, generator=g, device=dev) * 0.02).half()  # noqa: E731
    ones = lambda: torch.ones(h, dtype=torch.float16, device=dev)  # noqa: E731
    m = "midlayer."
    ids = torch.randperm(s["vocab"], generator=g, device=dev)[: s["draft_vocab"]].sort().values.cpu()
    t2d = torch.zeros(s["vocab"], dtype=torch.bool)
    t2d[ids] = True
    tensors = {"fc.weight": r(h, 3 * h), m + "input_layernorm.weight": ones(), m + "hidden_norm.weight": ones(),
               m + "self_attn.q_proj.weight": r(s["heads"] * d, 2 * h),
               m + "self_attn.k_proj.weight": r(s["kv_heads"] * d, 2 * h),
               m + "self_attn.v_proj.weight": r(s["kv_heads"] * d, 2 * h),
               m + "self_attn.o_proj.weight": r(h, s["heads"] * d), m + "post_attention_layernorm.weight": ones(),
               m + "mlp.gate_proj.weight": r(i, h), m + "mlp.up_proj.weight": r(i, h), m + "mlp.down_proj.weight": r(h, i),
               "norm.weight": ones(), "lm_head.weight": r(s["draft_vocab"], h),
               "d2t": ids - torch.arange(s["draft_vocab"]), "t2d": t2d}
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": h,
           "intermediate_size": i, "num_hidden_layers": 1, "num_attention_heads": s["heads"],
           "num_key_value_heads": s["kv_heads"], "vocab_size": s["vocab"], "draft_vocab_size": s["draft_vocab"],
           "rms_norm_eps": 1e-5, "max_position_embeddings": 2048, "hidden_act": "silu", "torch_dtype": "float16",
           "tie_word_embeddings": False, "bos_token_id": 128000, "eos_token_id": 128001}
    return write_head(path, cfg, tensors, "original")


def target_spec(shape: dict = SHAPE):
    from graphrt.model.spec import LlamaSpec
    s = shape
    return LlamaSpec(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["intermediate"],
                     num_layers=s["layers"], num_heads=s["heads"], num_kv_heads=s["kv_heads"], head_dim=s["head_dim"],
                     rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False, attention_bias=False,
                     max_position_embeddings=131072)


def graphed(fn):
    """Capture fn() (static inputs) into a CUDA graph after a warm-up; returns replay."""
    from graphrt.kernels.timing import capture
    return capture(fn).replay


def kernel_table(replay, replays: int = 20) -> list[dict]:
    """Per-kernel device µs per replay() of a captured graph (torch.profiler), largest first."""
    from torch.profiler import ProfilerActivity, profile
    replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            replay()
        torch.cuda.synchronize()
    us, n = {}, {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA or "Memcpy" in e.name or "Memset" in e.name:
            continue
        t = (e.device_time if hasattr(e, "device_time") else e.cuda_time) / replays
        us[e.name[:70]] = us.get(e.name[:70], 0.0) + t
        n[e.name[:70]] = n.get(e.name[:70], 0) + 1
    return [{"kernel": k, "us": round(v, 2), "launches": n[k] / replays}
            for k, v in sorted(us.items(), key=lambda kv: -kv[1])]


def run(batches, context: int, k: int, log=print, profile_calls=()) -> dict:
    from benchlib import copy_bandwidth, device_us
    from graphrt.attention.kvcache import PagedKVCache
    from graphrt.kernels.multiquery_attention import default_splits
    from graphrt.speculative.eagle3 import Eagle3Drafter, Eagle3Head, load_eagle3
    dev = torch.device("cuda")
    with tempfile.TemporaryDirectory() as tmp:
        write_random_head(Path(tmp) / "head")
        ck = load_eagle3(Path(tmp) / "head", target_spec(), dtype=torch.bfloat16, device=dev)
    c, w = ck.config, ck.weights
    embed = torch.randn(c.vocab_size, c.hidden_size, device=dev, dtype=torch.bfloat16) * 0.02
    head = Eagle3Head(c, w, target_embed=embed, max_positions=context + 4 * k + 16)
    bw = copy_bandwidth(torch)
    el = w.fc.element_size()
    layer = sum(t.numel() for t in (w.qkv, w.o, w.gate_up, w.down, w.lm_head)) * el
    fc = w.fc.numel() * el
    page = 16
    rows = []
    for b in batches:
        pages_per = (context + 2 * k + page) // page
        cache = PagedKVCache(torch.randn(b * pages_per, page, c.num_kv_heads, c.head_dim, device=dev, dtype=torch.bfloat16),
                             torch.randn(b * pages_per, page, c.num_kv_heads, c.head_dim, device=dev, dtype=torch.bfloat16))
        table = torch.arange(b * pages_per, dtype=torch.int32, device=dev).view(b, pages_per).contiguous()
        splits = default_splits(dev, b, c.num_kv_heads, context + 2 * k)
        err = torch.zeros(1, dtype=torch.int32, device=dev)
        h_prev = torch.randn(b, c.hidden_size, device=dev, dtype=torch.bfloat16)   # consumed (written in
        h_prev *= 1e-3                            # place) each replay: small, so replays stay finite
        toks = torch.randint(0, c.vocab_size, (b,), device=dev)
        cl = torch.full((b,), context - 1, dtype=torch.int32, device=dev)
        h3 = torch.randn(b, k + 1, 3 * c.hidden_size, device=dev, dtype=torch.bfloat16)
        emitted = torch.randint(0, c.vocab_size, (b, k + 1), device=dev)
        count = torch.full((b,), k // 2 + 1, dtype=torch.int32, device=dev)      # a + 1 emitted, a = k // 2
        props = torch.empty(b, k, dtype=torch.int64, device=dev)
        drafter = Eagle3Drafter(head, cache, k, max_len=context + 2 * k, splits=splits, max_batch=b)
        kv_row = 2 * c.num_kv_heads * c.head_dim * el                       # K + V bytes per position
        calls = {
            "chain step": (lambda: head.chain_step(h_prev, toks, cl, cache, table, err, splits=drafter.chain_splits(b),
                                                   scratch=drafter.scratch),
                           layer + b * context * kv_row),
            f"extend (Q={k + 1})": (lambda: head.extend(h3, emitted, cl - k, cache, table, err, splits=splits),
                                    fc + layer + b * context * kv_row),
            f"round (k={k})": (lambda: drafter.round(h3, emitted, cl - k, count, table, props, err),
                               fc + k * layer + b * k * context * kv_row)}
        for name, (fn, nbytes) in calls.items():
            replay = graphed(fn)
            us = device_us(replay, torch, reps=50, repeats=5)
            floor = nbytes / bw * 1e6
            rows.append({"batch": b, "call": name, "us": round(us, 1), "bytes": nbytes, "floor_us": round(floor, 1),
                         "ratio": round(us / floor, 2)})
            if name.split(" (")[0] in profile_calls:
                rows[-1]["kernels"] = kernel_table(replay)
                kern = sum(r["us"] for r in rows[-1]["kernels"])
                log(f"batch {b} {name}: {us:.1f} us, kernels {kern:.1f} us in "
                    f"{sum(r['launches'] for r in rows[-1]['kernels']):.0f} launches")
                for r in rows[-1]["kernels"]:
                    log(f"  {r['us']:8.2f} us  x{r['launches']:.0f}  {r['kernel']}")
        if int(err):
            raise RuntimeError(f"device_error {int(err)}")
    log(f"copy bandwidth {bw / 1e12:.2f} TB/s; head weights {w.nbytes / 1e6:.0f} MB "
        f"(layer + lm_head {layer / 1e6:.0f} MB, fc {fc / 1e6:.0f} MB); context {context}")
    log(f"{'batch':>5}  {'call':<16}{'us':>9}{'floor us':>10}{'ratio':>7}")
    for r in rows:
        log(f"{r['batch']:>5}  {r['call']:<16}{r['us']:>9.1f}{r['floor_us']:>10.1f}{r['ratio']:>7.2f}")
    return {"device": torch.cuda.get_device_name(), "copy_bandwidth_Bps": bw, "context": context, "k": k,
            "head_bytes": w.nbytes, "layer_bytes": layer, "fc_bytes": fc, "rows": rows,
            "layout_loaded": c.layout, "draft_vocab": c.draft_vocab_size}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", default="1,4")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--json", default=None)
    p.add_argument("--profile", default="", help="calls to profile per kernel: chain step, extend, round (comma list)")
    a = p.parse_args(argv)
    try:
        batches = [int(x) for x in a.batch.split(",") if x]
    except ValueError:
        batches = []
    if not batches or min(batches) < 1 or a.context < 2 * a.k or a.k < 1:
        print("bench_eagle3_step: --batch: ints >= 1; --k >= 1; --context >= 2k", file=sys.stderr)
        return 2
    known = {"chain step", "extend", "round"}
    prof = tuple(x.strip() for x in a.profile.split(",") if x.strip())
    if set(prof) - known:
        print(f"bench_eagle3_step: --profile: {sorted(set(prof) - known)} not among {sorted(known)}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_eagle3_step: needs a CUDA GPU", file=sys.stderr)
        return 2
    out = run(batches, a.context, a.k, profile_calls=prof)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
