"""Write a GPTQ-layout int4 checkpoint from a float HF checkpoint: GPTQ or round-to-nearest.

    python tools/quantize_int4.py SRC OUT [--method gptq|rtn] [--group-size 128] [--sym]
        [--act-order] [--format gptq_v2|gptq] [--calib-files 128] [--calib-window 512]
        [--device cuda|cpu]

The result loads with `graphrt.LLM(OUT)` (graphrt/checkpoint/int4_gptq.py) and with other GPTQ
readers: config.json gets `quantization_config` {quant_method gptq, bits 4, group_size, sym,
desc_act, checkpoint_format}; every decoder linear layer becomes `qweight` I32 [K/8, N] (packed
along K, nibble i = input channel 8r + i), `qzeros` I32 [G, N/8] (packed along N; v1 "gptq"
stores zero - 1, so asymmetric v1 zeros are kept >= 1), `scales` F16 [G, N], `g_idx` I32 [K];
embeddings, norms and the LM head are copied as they are. For the quality comparison of
docs/int4.md: `tools/eval_ppl.py OUT --reference SRC` scores it against HF float32 over SRC.

--method gptq (after Frantar et al., "GPTQ", 2022): per linear layer H = X^T X over calibration
activations (the training split of tools/train_tiny.py's corpus: never the held-out files that
eval_ppl scores), collected from the float model in one pass (not layer by layer; all Hessians
are held at once: meant for small models such as the trained tiny family and SmolLM2-135M),
dampened by 1% of its mean diagonal. Columns are quantized in order (--act-order: by decreasing
diag(H); g_idx then maps channels to groups of that order); each column's rounding error,
divided by the diagonal of the upper Cholesky factor of H^-1, is propagated to the columns not
yet quantized (in blocks of 128 columns), and a group's scale and zero are fitted to its
columns' values when the group's first column comes up. --method rtn: round-to-nearest per group.
Scales: asymmetric (max - min) / 15 with zero round(-min / scale); symmetric 2 * amax / 15 with
zero 8.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BLOCK = 128


def fit(w: torch.Tensor, sym: bool, zero_min: int) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, g] float32 -> (scale [N] rounded to float16, then float32; zero [N] float, integers)."""
    if sym:
        scale = (w.abs().amax(1) * 2 / 15).clamp(min=1e-8).half().float()
        return scale, torch.full_like(scale, 8.0)
    lo, hi = w.amin(1).clamp(max=0), w.amax(1).clamp(min=0)
    scale = ((hi - lo) / 15).clamp(min=1e-8).half().float()
    return scale, torch.round(-lo / scale).clamp(zero_min, 15)


def quantize_layer(w: torch.Tensor, h: torch.Tensor | None, g: int, sym: bool, act_order: bool, zero_min: int):
    """w [N, K] float32, h [K, K] (None: round-to-nearest) -> (codes [N, K] int64 in channel
    order, scale [N, G], zero [N, G], g_idx [K] int32)."""
    n, k = w.shape
    w = w.clone()
    perm = torch.arange(k, device=w.device)
    if h is not None:
        h = h.clone()
        dead = torch.diag(h) == 0
        h[dead, dead] = 1
        w[:, dead] = 0
        if act_order:
            perm = torch.argsort(torch.diag(h), descending=True)
            w, h = w[:, perm], h[perm][:, perm]
        h += 0.01 * torch.mean(torch.diag(h)) * torch.eye(k, device=w.device)
        hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    codes = torch.zeros(n, k, dtype=torch.int64, device=w.device)
    scales, zeros = [], []
    for b0 in range(0, k, BLOCK):
        b1 = min(b0 + BLOCK, k)
        w1, err1 = w[:, b0:b1].clone(), torch.zeros(n, b1 - b0, device=w.device)
        for i in range(b1 - b0):
            col = b0 + i
            if col % g == 0:                                     # fit the group to its current values
                s, z = fit(torch.cat([w1[:, i:], w[:, b1:]], 1)[:, :g], sym, zero_min)
                scales.append(s)
                zeros.append(z)
            q = (torch.round(w1[:, i] / s) + z).clamp(0, 15)
            codes[:, col] = q.long()
            if h is not None:
                e = (w1[:, i] - (q - z) * s) / hinv[col, col]
                w1[:, i:] -= e[:, None] * hinv[col, col:b1][None, :]
                err1[:, i] = e
        if h is not None:
            w[:, b1:] -= err1 @ hinv[b0:b1, b1:]
    out = torch.empty_like(codes)
    out[:, perm] = codes
    g_idx = torch.empty(k, dtype=torch.int32, device=w.device)
    g_idx[perm] = (torch.arange(k, device=w.device) // g).to(torch.int32)
    return out, torch.stack(scales, 1), torch.stack(zeros, 1), g_idx


def pack(vals: torch.Tensor) -> torch.Tensor:
    """[R, 8C] ints 0..15 -> int32 [R, C]: word c = sum_i vals[:, 8c + i] << 4i."""
    v = vals.to(torch.int64).reshape(vals.shape[0], -1, 8) << (torch.arange(8, device=vals.device) * 4)
    word = v.sum(-1)
    return torch.where(word >= 2 ** 31, word - 2 ** 32, word).to(torch.int32)


def hessians(model, seqs: list[list[int]], device) -> dict[str, torch.Tensor]:
    """Module name -> X^T X [K, K] float32 over the calibration tokens (q/k/v and gate/up share
    their input's)."""
    hs: dict[str, torch.Tensor] = {}
    hooks = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name.endswith(LINEAR):
            key = name.rsplit(".", 1)[0] + (".in" if name.endswith(("q_proj", "k_proj", "v_proj")) else
                                            ".mlp_in" if name.endswith(("gate_proj", "up_proj")) else "." + name)

            def hook(mod, args, out, key=key, first=name.endswith(("q_proj", "gate_proj", "o_proj", "down_proj"))):
                if first:
                    x = args[0].reshape(-1, args[0].shape[-1]).float()
                    hs[key] = hs.get(key, 0) + x.T @ x
            hooks.append(mod.register_forward_hook(hook))
            hs.setdefault("_names", {})[name] = key
    with torch.no_grad():
        for s in seqs:
            model(torch.tensor([s], device=device))
    for hk in hooks:
        hk.remove()
    names = hs.pop("_names")
    return {name: hs[key] for name, key in names.items()}


def calibration(tok, files: int, window: int) -> list[list[int]]:
    import train_tiny
    texts = [t for _, t in train_tiny.read_split(False, max_bytes=files * window * 8)][:files]
    return [ids[:window] for ids in train_tiny.encode_files(tok, texts) if len(ids) >= 16]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("--method", default="gptq", choices=["gptq", "rtn"])
    p.add_argument("--group-size", type=int, default=128, choices=[32, 64, 128, -1])
    p.add_argument("--sym", action="store_true", help="symmetric (zero 8); default asymmetric")
    p.add_argument("--act-order", action="store_true", help="GPTQ desc_act: columns by decreasing diag(H)")
    p.add_argument("--format", default="gptq_v2", choices=["gptq_v2", "gptq"])
    p.add_argument("--calib-files", type=int, default=128)
    p.add_argument("--calib-window", type=int, default=512)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    a = p.parse_args(argv)
    src, out = Path(a.src), Path(a.out)
    if not (src / "config.json").is_file():
        p.error(f"src: {src} is not a checkpoint directory (no config.json)")
    if out.exists():
        p.error(f"out: {out} exists; give a new directory")
    if a.calib_files < 1 or a.calib_window < 16:
        p.error("--calib-files must be >= 1 and --calib-window >= 16")
    if a.act_order and a.method == "rtn":
        p.error("--act-order needs --method gptq (round-to-nearest has no column order)")
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    device = torch.device(a.device)
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).to(device).eval()
    hs = {}
    if a.method == "gptq":
        hs = hessians(model, calibration(AutoTokenizer.from_pretrained(str(src)), a.calib_files, a.calib_window),
                      device)
    cfg = json.loads((src / "config.json").read_text())
    keep = getattr(torch, str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"))   # unquantized tensors
    tied = bool(cfg.get("tie_word_embeddings"))
    tensors = {}
    zero_min = 1 if a.format == "gptq" and not a.sym else 0
    for name, t in model.state_dict().items():
        module = name.removesuffix(".weight")
        if not (name.endswith(".weight") and module.endswith(LINEAR)):
            if not (tied and name == "lm_head.weight"):
                tensors[name] = t.to(keep).cpu().clone()
            continue
        k = t.shape[1]
        g = k if a.group_size == -1 else a.group_size
        if k % g or k % 8 or t.shape[0] % 8:
            print(f"quantize_int4: {name} {list(t.shape)}: group size {g} must divide K; K and N multiples of 8",
                  file=sys.stderr)
            return 2
        codes, scale, zero, g_idx = quantize_layer(t.float(), hs.get(module), g, a.sym, a.act_order, zero_min)
        stored = zero - 1 if a.format == "gptq" else zero
        tensors |= {f"{module}.qweight": pack(codes).T.contiguous().cpu(),
                    f"{module}.qzeros": pack(stored.T.long()).contiguous().cpu(),
                    f"{module}.scales": scale.T.half().contiguous().cpu(),
                    f"{module}.g_idx": g_idx.cpu()}
        print(f"{module}: {list(t.shape)} {a.method}", file=sys.stderr)
    out.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copy(f, out / f.name)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": a.group_size, "sym": a.sym,
                                  "desc_act": a.act_order, "checkpoint_format": a.format,
                                  "graphrt_method": a.method}
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    print(f"wrote {out} ({a.method}, group {a.group_size}, {'sym' if a.sym else 'asym'}, {a.format})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
