"""Speculative decoding, part (1) mechanics: device time of a verify step vs a decode step (GPU).

Random bf16 models with the Llama-3.1-8B and 3.2-1B shapes (tools/bench_e2e.py's random_model),
every request at `--context` tokens. Per model x batch, side by side in one run:
  decode_us      one captured decode step (ModelRuntime, FlashInfer backend, device planner)
  verify_us[q]   one captured LlamaDecoder.verify_step of q = k + 1 tokens per request
                 (plan-free multi-query Triton attention, default split-KV), q = 1..8
  round_us[q]    one captured speculative round (n-gram proposer + verify + judge + advance,
                 SpeculativeRunner with R = 1), q = 2..8
  ratio          verify_us[5] / decode_us (target: <= 1.10 at bs 1, 1k context, 8B)
Attention alone (--attention): the Triton multi-query kernel vs FlashInfer XQA with
q_len_per_req=q (sm_90), device µs per layer call and the max |difference| of the outputs
(XQA's masking for q > 1 is reported, not assumed). Device time: CUDA events around graph
replays, median of 5 bursts (tools/benchlib.device_us). Part (3) is a labelled PROJECTION: an
8B target with a 1B draft, from these measured step costs and assumed acceptance rates.
Parts (2) and (3) with --trained DIR (tools/bench_spec_trained.py): the trained family through
`LLM(path, speculative=...)`, tokens/s per stream and measured acceptance, and the 8B projection
from part 1's JSON and that measured acceptance. Writes JSON (and a PNG).

    python tools/bench_spec.py --out $OUT/bench_spec.json --png $OUT/bench_spec.png
    python tools/bench_spec.py --trained DIR --out $OUT/bench_spec_trained.json --png $OUT/bench_spec_trained.png
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench_e2e import random_model
from benchlib import device_us, pyplot


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="llama-3.1-8b,llama-3.2-1b")
    p.add_argument("--batches", default="1,2,4,8,16")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--qs", default="1,2,3,4,5,6,7,8")
    p.add_argument("--no-round", dest="round", action="store_false")
    p.add_argument("--no-attention", dest="attention", action="store_false")
    p.add_argument("--out", default="bench_spec.json")
    p.add_argument("--png", default=None)
    part2 = p.add_argument_group("parts (2) + (3): the trained family through LLM (bench_spec_trained.py)")
    part2.add_argument("--trained", default=None, metavar="DIR",
                       help="tools/train_tiny.py output (DIR/target, DIR/draft): run parts 2 and 3 instead of 1")
    part2.add_argument("--smoke", action="store_true", help="micro plan (1 prompt, 4 tokens, bs 1): a CPU check")
    part2.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    part2.add_argument("--methods", default="none,ngram,draft",
                       help="comma list of none, ngram, draft, eagle3 (eagle3: DIR/eagle3 from tools/train_eagle3.py)")
    part2.add_argument("--prompts", type=int, default=None, metavar="N",
                       help="prompts per workload (default 8; fewer for a shorter run)")
    part2.add_argument("--num-tokens", type=int, default=None, metavar="K",
                       help="proposals a round, the speculative config's num_tokens (default 4)")
    part2.add_argument("--costs", default=None, metavar="JSON",
                       help="part-1 JSON for the 8B projection (default docs/results/bench_spec_h200.json)")
    return p.parse_args(argv)


def _ints(s):
    return [int(x) for x in s.split(",") if x]


def bench_model(name, batches, qs, ctx, do_round, torch, model=None):
    """Rows of device µs for one model (a random one of shape `name`, or `model`: e.g. a loaded
    checkpoint, then `name` only labels the rows)."""
    from graphrt import RuntimeConfig
    from graphrt.attention.graphs import GraphKey, GraphRunner
    from graphrt.kernels.multiquery_attention import default_splits
    from graphrt.model.runtime import ModelRuntime
    from graphrt.speculative import SpeculativeConfig, SpeculativeRunner
    if model is None:
        model, _ = random_model(name, torch)
    s = model.spec
    max_q = max(qs)
    width = ctx + 64 * max_q + 64                                  # token positions per request
    pages = -(-width // 16)
    rows = []
    for n in batches:
        cfg = RuntimeConfig(num_qo_heads=s.num_heads, num_kv_heads=s.num_kv_heads, head_dim=s.head_dim,
                            page_size=16, max_pages_per_seq=pages, buckets=[n], dtype="bfloat16",
                            backend="flashinfer", kv_pool_pages=n * pages + 1)
        mrt = ModelRuntime(model, cfg, "cuda")
        mrt.capture()
        table = torch.arange(n * pages, dtype=torch.int32, device="cuda").view(n, pages) + 1
        lens = torch.full((n,), ctx, dtype=torch.int32, device="cuda")
        tokens = torch.randint(0, s.vocab_size, (n,), device="cuda")
        mrt.decode(tokens, table, lens)
        view = mrt.buffers.view(n)
        row = {"model": name, "batch": n, "context": ctx,
               "decode_us": device_us(lambda: mrt.decode_slots(n, sampled=False), torch), "verify_us": {},
               "round_us": {}}
        view.seq_lens[:n].fill_(ctx)                               # replays keep advancing it
        err = torch.zeros(1, dtype=torch.int32, device="cuda")
        splits = default_splits(torch.device("cuda"), n, s.num_kv_heads, width)
        row["splits"] = splits
        for q in qs:
            toks = torch.randint(0, s.vocab_size, (n, q), device="cuda")
            cache_lens = torch.full((n,), ctx - 1, dtype=torch.int32, device="cuda")
            graphs, key = GraphRunner(torch.device("cuda")), GraphKey("bench-verify", n, q)
            verify = lambda: model.verify_step(toks, cache_lens, mrt.kv_caches, table, err,  # noqa: E731
                                               splits=splits)
            graphs.capture(key, verify)
            row["verify_us"][q] = device_us(lambda: graphs.run(key, verify), torch)
            graphs.drop(key)
            if do_round and q >= 2:
                runner = SpeculativeRunner(model, mrt.kv_caches, SpeculativeConfig(num_tokens=q - 1),
                                           buckets=(n,), max_len=width, page_size=16,
                                           max_pages=pages, rounds=1, ks=(q - 1,))
                prompt = torch.randint(0, s.vocab_size, (ctx,)).tolist()
                for i in range(n):
                    runner.set_slot(i, prompt, limit=width - q, block_table=table[i].cpu())
                runner.capture()
                row["round_us"][q] = device_us(lambda: runner.run(n), torch, reps=10, repeats=5)
                del runner
        if int(err) or int(mrt.buffers.device_error):
            print(f"warning: device_error {int(err)} / {int(mrt.buffers.device_error)}", file=sys.stderr)
        row["ratio_q5"] = row["verify_us"].get(5, float("nan")) / row["decode_us"]
        rows.append(row)
        del mrt
        torch.cuda.empty_cache()
    del model
    torch.cuda.empty_cache()
    return rows


def bench_attention(batches, qs, ctx, torch):
    """Triton multi-query kernel vs FlashInfer XQA(q_len_per_req), 8B attention shape, one layer."""
    from graphrt.attention.kvcache import PagedKVCache
    from graphrt.kernels.multiquery_attention import default_splits, multiquery_attention
    hq, hkv, d, page = 32, 8, 128, 16
    rows = []
    try:
        from flashinfer.decode import trtllm_batch_decode_with_kv_cache as xqa
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        xqa, xqa_err = None, repr(e)
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
    for n in batches:
        pages = -(-(ctx + 16) // page)
        shape = (n * pages + 1, page, hkv, d)
        kv = PagedKVCache(torch.randn(shape, device="cuda", dtype=torch.bfloat16),
                          torch.randn(shape, device="cuda", dtype=torch.bfloat16), "NHD")
        table = torch.arange(n * pages, dtype=torch.int32, device="cuda").view(n, pages) + 1
        lens = torch.full((n,), ctx, dtype=torch.int32, device="cuda")
        splits = default_splits(torch.device("cuda"), n, hkv, ctx)
        for q in qs:
            qt = torch.randn((n, q, hq, d), device="cuda", dtype=torch.bfloat16)
            mine = multiquery_attention(qt, kv, table, lens, splits=splits)
            row = {"batch": n, "q": q, "context": ctx, "splits": splits,
                   "triton_us": device_us(lambda: multiquery_attention(qt, kv, table, lens, splits=splits),
                                          torch, reps=20)}
            if xqa is None:
                row["xqa_error"] = xqa_err
            else:
                try:
                    call = lambda: xqa(qt.view(n * q, hq, d), kv.as_tuple(), ws, table, lens, ctx + 16,  # noqa: E731
                                       bmm1_scale=d ** -0.5, bmm2_scale=1.0, kv_layout="NHD",
                                       backend="xqa", q_len_per_req=q)
                    theirs = call().view(n, q, hq, d)
                    row["xqa_us"] = device_us(call, torch, reps=20)
                    row["max_abs_diff_vs_triton"] = float((theirs.float() - mine.float()).abs().max())
                except Exception as e:  # noqa: BLE001 - an unsupported configuration is data
                    row["xqa_error"] = repr(e)[:200]
            rows.append(row)
    return rows


def projection(rows, target="llama-3.1-8b", draft="llama-3.2-1b", accepts=(0.5, 0.6, 0.7, 0.8)):
    """PROJECTION (not a measurement): speed-up of an 8B target with a 1B draft at each batch,
    from the measured step costs: E[tokens/round] = (1 - a^(k+1)) / (1 - a) for per-token
    acceptance a (i.i.d. model); round = k x t_draft(decode) + t_verify(k + 1);
    speed-up = E x t_decode(target) / round. Returns rows {batch, a, k, speedup, t_draft/t_step}."""
    by = {(r["model"], r["batch"]): r for r in rows}
    out = []
    for (model, n), t in sorted(by.items()):
        d = by.get((draft, n))
        if model != target or d is None:
            continue
        for a in accepts:
            best = None
            for q, verify in sorted(t["verify_us"].items()):
                k = int(q) - 1
                if k < 1:
                    continue
                e = (1 - a ** (k + 1)) / (1 - a)
                speed = e * t["decode_us"] / (k * d["decode_us"] + verify)
                if best is None or speed > best["speedup"]:
                    best = {"batch": n, "a": a, "k": k, "speedup": speed,
                            "draft_over_target": d["decode_us"] / t["decode_us"]}
            if best:
                out.append(best)
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    if args.trained is not None:
        import bench_spec_trained
        args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        return bench_spec_trained.main(args)
    if not torch.cuda.is_available():
        print("bench_spec: needs a CUDA GPU", file=sys.stderr)
        return 2
    qs, batches = _ints(args.qs), _ints(args.batches)
    result = {"device": torch.cuda.get_device_name(), "models": [], "attention": []}
    for name in args.models.split(","):
        result["models"] += bench_model(name, batches, qs, args.context, args.round, torch)
        Path(args.out).write_text(json.dumps(result, indent=1))
    result["projection_8b_with_1b_draft"] = projection(result["models"])
    if args.attention:
        result["attention"] = bench_attention(batches, [q for q in qs if q > 1], args.context, torch)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"\ncontext {args.context}; device µs per step (verify q = k + 1 tokens per request)")
    head = f"{'model':<14}{'bs':>4}{'decode':>9}" + "".join(f"{'v' + str(q):>8}" for q in qs) + \
           f"{'v5/dec':>8}" + "".join(f"{'r' + str(q):>8}" for q in qs if q > 1 and args.round)
    print(head)
    for r in result["models"]:
        line = f"{r['model']:<14}{r['batch']:>4}{r['decode_us']:>9.1f}"
        line += "".join(f"{r['verify_us'][q]:>8.1f}" for q in qs) + f"{r['ratio_q5']:>8.2f}"
        line += "".join(f"{r['round_us'].get(q, float('nan')):>8.1f}" for q in qs if q > 1 and args.round)
        print(line)
    if result["attention"]:
        print("\nattention alone, 8B shape (32/8 heads, d 128), one layer: triton vs xqa µs, max|diff|")
        for a in result["attention"]:
            x = f"{a['xqa_us']:.1f} {a['max_abs_diff_vs_triton']:.3g}" if "xqa_us" in a else a.get("xqa_error", "")[:60]
            print(f"bs {a['batch']:>3} q {a['q']}: triton {a['triton_us']:.1f} (splits {a['splits']})  xqa {x}")
    if result["projection_8b_with_1b_draft"]:
        print("\nPROJECTION (arithmetic from the measured costs above, not measured): 8B target, "
              "1B draft, best k per acceptance a")
        for p in result["projection_8b_with_1b_draft"]:
            print(f"bs {p['batch']:>3} a {p['a']:.1f}: k {p['k']}  {p['speedup']:.2f}x  "
                  f"(t_1B / t_8B = {p['draft_over_target']:.2f})")
    plt = pyplot() if args.png else None
    if plt is not None:
        fig, axes = plt.subplots(1, len(args.models.split(",")), figsize=(12, 4), squeeze=False)
        for ax, name in zip(axes[0], args.models.split(",")):
            for r in (r for r in result["models"] if r["model"] == name):
                ax.plot(qs, [r["verify_us"][q] / r["decode_us"] for q in qs], marker="o", label=f"bs {r['batch']}")
            ax.axhline(1.10, color="gray", ls="--")
            ax.set(title=f"{name}, ctx {args.context}", xlabel="q = k + 1 tokens per request",
                   ylabel="verify / decode device time")
            ax.legend()
        fig.tight_layout()
        fig.savefig(args.png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
