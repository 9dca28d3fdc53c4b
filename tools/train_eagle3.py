"""Train an EAGLE-3 head for a target of tools/train_tiny.py on the same corpus; save it in the public format.

    python tools/train_eagle3.py --target DIR/target --out DIR/eagle3 [--steps N | --time-budget-s S]
        [--ttt 3] [--seq-len 512] [--batch 16] [--lr 1e-3] [--device cuda] [--eval-prompts 16]
    python tools/train_eagle3.py --smoke --out DIR      # CPU: micro 8-layer target, micro head, eval

The target is frozen and run online (transformers, `output_hidden_states`): each batch of random
windows of the train split gives the three hidden states the head reads (layer ids (2, L//2, L-3))
and the soft labels (the target's next-token distribution over the draft vocabulary, here the
whole vocabulary: d2t all zeros, t2d all true). Training-time test: the head runs --ttt steps
unrolled; step i feeds back step i-1's own pre-norm hidden state and argmax token, sits at
position t + i and attends to the target-path keys up to t plus its own chain's keys; the
soft cross-entropy of step i is weighted 0.8^i. lm_head and the final norm start from the
target's. The head is saved as config.json + model.safetensors (bf16) in the original layout,
then loaded back through graphrt's loader to measure the offline acceptance length at k = 4 on
held-out completion (tools/eagle3_accept.py). Writes train_eagle3.json.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DECAY = 0.8
SMOKE_TARGET = dict(arch="llama", hidden=64, intermediate=128, layers=8, heads=1, kv_heads=1, tied=False, lr=3e-3)


class HeadModel(torch.nn.Module):
    """The head as trainable torch modules (original-layout names through `public_tensors`)."""

    def __init__(self, cfg, target):
        super().__init__()
        h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
        self.cfg, self.hq, self.hkv, self.d = cfg, cfg.num_heads, cfg.num_kv_heads, d
        lin = lambda n, k: torch.nn.Linear(k, n, bias=False)  # noqa: E731
        self.fc, self.q, self.k, self.v = lin(h, 3 * h), lin(self.hq * d, 2 * h), lin(self.hkv * d, 2 * h), \
            lin(self.hkv * d, 2 * h)
        self.o, self.gate, self.up, self.down = lin(h, self.hq * d), lin(i, h), lin(i, h), lin(h, i)
        self.lm_head = lin(cfg.draft_vocab_size, h)
        for m in (self.fc, self.q, self.k, self.v, self.o, self.gate, self.up, self.down):
            torch.nn.init.normal_(m.weight, std=0.02)
        ones = lambda: torch.nn.Parameter(torch.ones(h))  # noqa: E731
        self.input_norm, self.hidden_norm, self.post_norm = ones(), ones(), ones()
        with torch.no_grad():
            self.lm_head.weight.copy_(target.get_output_embeddings().weight.float())
            self.norm = torch.nn.Parameter(target.model.norm.weight.detach().float().clone())
        inv = 1.0 / cfg.rope_theta ** (torch.arange(0, d, 2).float() / d)
        self.register_buffer("inv_freq", inv, persistent=False)

    def _rms(self, x, w):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.cfg.rms_norm_eps).to(x.dtype) * w

    def _rope(self, x, pos):                                   # x [B, h, L, D], pos [L]
        ang = pos[:, None].float() * self.inv_freq[None]
        cos, sin = torch.cat([ang.cos()] * 2, -1).to(x.dtype), torch.cat([ang.sin()] * 2, -1).to(x.dtype)
        return x * cos + torch.cat([-x[..., self.d // 2:], x[..., : self.d // 2]], -1) * sin

    def forward(self, h3, embed_next, labels, valid, steps: int, embed_table):
        """h3 [B, L, 3H], embed_next [B, L, H] (embedding of token t+1), labels [B, L + steps - 1, Vd]
        probabilities at positions 1 .. (label of step i row t: position t + 1 + i), valid
        [B, L + steps - 1] bool. Returns (loss, per-step accuracy list)."""
        b, n, _ = h3.shape
        g, emb = self.fc(h3), embed_next
        keys, values = [], []
        base = torch.arange(n, device=h3.device)
        causal = base[None, :] <= base[:, None]                               # [L, L]
        eye = torch.eye(n, dtype=torch.bool, device=h3.device)
        loss, accs = 0.0, []
        for i in range(steps):
            x = torch.cat([self._rms(emb, self.input_norm), self._rms(g, self.hidden_norm)], -1)
            q = self._rope(self.q(x).view(b, n, self.hq, self.d).transpose(1, 2), base + i)
            keys.append(self._rope(self.k(x).view(b, n, self.hkv, self.d).transpose(1, 2), base + i))
            values.append(self.v(x).view(b, n, self.hkv, self.d).transpose(1, 2))
            rep = self.hq // self.hkv
            kk = torch.cat(keys, 2).repeat_interleave(rep, 1)
            vv = torch.cat(values, 2).repeat_interleave(rep, 1)
            mask = torch.cat([causal] + [eye] * i, 1)                          # [L, L (i + 1)]
            o = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)
            h = g + self.o(o.transpose(1, 2).reshape(b, n, -1))
            y = self._rms(h, self.post_norm)
            h = h + self.down(F.silu(self.gate(y)) * self.up(y))
            logits = self.lm_head(self._rms(h, self.norm)).float()
            lab, ok = labels[:, i: i + n], valid[:, i: i + n]
            ce = -(lab * F.log_softmax(logits, -1)).sum(-1)
            loss = loss + DECAY ** i * (ce * ok).sum() / ok.sum().clamp_min(1)
            with torch.no_grad():
                pred = logits.argmax(-1)
                accs.append(float(((pred == lab.argmax(-1)) & ok).sum() / ok.sum().clamp_min(1)))
            g, emb = h, embed_table[pred]                # own hidden state and own token fed back
        return loss, accs

    def public_tensors(self) -> dict:
        m, w = "midlayer.", lambda mod: mod.weight.detach()  # noqa: E731
        v, vd = self.cfg.vocab_size, self.cfg.draft_vocab_size
        return {"fc.weight": w(self.fc), m + "input_layernorm.weight": self.input_norm.detach(),
                m + "hidden_norm.weight": self.hidden_norm.detach(), m + "self_attn.q_proj.weight": w(self.q),
                m + "self_attn.k_proj.weight": w(self.k), m + "self_attn.v_proj.weight": w(self.v),
                m + "self_attn.o_proj.weight": w(self.o), m + "post_attention_layernorm.weight": self.post_norm.detach(),
                m + "mlp.gate_proj.weight": w(self.gate), m + "mlp.up_proj.weight": w(self.up),
                m + "mlp.down_proj.weight": w(self.down), "norm.weight": self.norm.detach(),
                "lm_head.weight": w(self.lm_head), "d2t": torch.zeros(vd, dtype=torch.int64),
                "t2d": torch.ones(v, dtype=torch.bool)}


def head_config(tcfg):
    """Eagle3Config of a full-vocabulary head for a transformers target config."""
    from graphrt.model.spec import LlamaSpec
    from graphrt.speculative.eagle3 import Eagle3Config
    s = LlamaSpec.from_hf(tcfg)
    scaling = s.rope_scaling if (s.rope_scaling or {}).get("rope_type", "default") != "default" else None
    return Eagle3Config(layout="original", hidden_size=s.hidden_size, intermediate_size=s.intermediate_size,
                        num_heads=s.num_heads, num_kv_heads=s.num_kv_heads, head_dim=s.head_dim,
                        vocab_size=s.vocab_size, draft_vocab_size=s.vocab_size, rms_norm_eps=s.rms_norm_eps,
                        rope_theta=s.rope_theta, rope_scaling=scaling,
                        max_position_embeddings=s.max_position_embeddings, layer_ids=None,
                        torch_dtype="bfloat16"), s


def train(a, log=print) -> dict:
    import transformers
    from train_tiny import Windows, encode_files, lr_at, read_split
    from graphrt.speculative.eagle3.checkpoint import write_head
    from graphrt.speculative.eagle3.convert import original_config
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    torch.manual_seed(a.seed)
    target = transformers.AutoModelForCausalLM.from_pretrained(a.target, dtype=torch.bfloat16 if cuda else torch.float32)
    target = target.to(dev).eval().requires_grad_(False)
    tok = transformers.AutoTokenizer.from_pretrained(a.target)
    cfg, spec = head_config(target.config)
    ids = cfg.check_target(spec)
    if max(ids) >= spec.num_layers:
        raise ValueError(f"layer ids {ids}: the last must be < num_layers {spec.num_layers}")
    files = read_split(False, max_bytes=a.corpus_bytes)
    stream = torch.tensor([i for f in encode_files(tok, [t for _, t in files]) for i in f], device=dev)
    data = Windows(stream, a.seq_len + a.ttt - 1, a.batch, a.seed + 1)
    model = HeadModel(cfg, target).to(dev)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0,
                            **({"fused": True} if cuda else {}))
    embed = target.get_input_embeddings().weight.detach()
    total, step, t0, curve = a.steps or 10**9, 0, time.perf_counter(), []
    n = a.seq_len
    while step < total:
        for gr in opt.param_groups:
            gr["lr"] = lr_at(step, total, a.lr, min(30, max(1, total // 10)) if a.steps else 30)
        w = data.next()                                                  # [B, L + ttt]
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            out = target(input_ids=w, output_hidden_states=True, use_cache=False)
            h3 = torch.cat([out.hidden_states[i][:, :n] for i in ids], -1).float()
            labels = torch.softmax(out.logits[:, 1:].float(), -1)           # positions 1 .. L + ttt - 1
        valid = torch.ones(labels.shape[:2], dtype=torch.bool, device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            loss, accs = model(h3, embed[w[:, 1: n + 1]].float(), labels, valid, a.ttt, embed.float())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        opt.step()
        step += 1
        if a.steps is None and step == 5:                                # fit the budget from 3 timed steps
            if cuda:
                torch.cuda.synchronize()
            t_probe = time.perf_counter()
        if a.steps is None and step == 8:
            if cuda:
                torch.cuda.synchronize()
            per = (time.perf_counter() - t_probe) / 3
            total = max(step + 1, step + int((a.time_budget_s - (time.perf_counter() - t0)) / per))
            log(f"  head: {per * 1e3:.1f} ms/step -> {total} steps in {a.time_budget_s:.0f} s")
        if a.steps is None and time.perf_counter() - t0 > a.time_budget_s * 1.2:
            log(f"  head: over the time budget at step {step}; stopping")
            total = step
        if step % max(1, (total if total < 10**9 else 100) // 10) == 0 or step == total:
            curve.append({"step": step, "loss": round(float(loss.detach()), 4), "acc": [round(x, 3) for x in accs]})
            log(f"  step {step}: loss {float(loss.detach()):.3f}, top-1 agreement per TTT step {curve[-1]['acc']}")
    secs = time.perf_counter() - t0
    out_dir = Path(a.out)
    raw = original_config(cfg)
    tensors = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in model.public_tensors().items()}
    write_head(out_dir, raw, tensors, "original")
    return {"steps": step, "train_s": round(secs, 1), "ttt": a.ttt, "seq_len": n, "batch": a.batch,
            "lr": a.lr, "layer_ids": list(ids), "curve": curve, "head": str(out_dir)}


def _smoke_target(out: Path, log, a_steps: int = 200) -> Path:
    """A micro 8-layer target (distinct default capture layers need L >= 7) trained briefly on CPU."""
    from train_tiny import SIZES, ModelShape, Windows, encode_files, read_split, save_model, train_one, train_tokenizer
    preset = SIZES["micro"]
    files = read_split(False, max_bytes=preset.corpus_bytes)
    tok = train_tokenizer([t for _, t in files], out / "tokenizer", vocab=preset.vocab, max_bytes=preset.tokenizer_bytes)
    stream = torch.tensor([i for f in encode_files(tok, [t for _, t in files]) for i in f])
    val = [Windows(stream, preset.seq_len, preset.batch, 7).next()]
    model, _ = train_one("target", ModelShape(**SMOKE_TARGET), preset, stream, val, device=torch.device("cpu"),
                         steps=a_steps, budget_s=60.0, seed=0, log=log)
    save_model(model, tok, out / "target")
    return out / "target"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default=None, help="a train_tiny target directory")
    p.add_argument("--out", required=True)
    p.add_argument("--smoke", action="store_true", help="CPU: micro target + micro head + eval")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--smoke-target-steps", type=int, default=200, help="--smoke: steps of the micro target")
    p.add_argument("--time-budget-s", type=float, default=60.0)
    p.add_argument("--ttt", type=int, default=3, help="unrolled training-time-test steps (>= 3)")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--corpus-bytes", type=int, default=None)
    p.add_argument("--eval-prompts", type=int, default=16)
    p.add_argument("--eval-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    bad = [f"--{n.replace('_', '-')} must be >= {m}" for n, m in (("ttt", 3), ("seq_len", 8), ("batch", 1), ("k", 1),
           ("eval_prompts", 0), ("eval_tokens", 8), ("smoke_target_steps", 1)) if getattr(a, n) < m]
    if a.steps is not None and a.steps < 1:
        bad.append("--steps must be >= 1")
    if not a.smoke and a.target is None:
        bad.append("--target is required (or --smoke)")
    if a.device == "cuda" and not torch.cuda.is_available():
        bad.append("--device cuda but CUDA is not available")
    if bad:
        print(f"train_eagle3: {bad[0]}", file=sys.stderr)
        return 2
    from graphrt.engine.device import select_triton_mode
    select_triton_mode(torch.device(a.device))
    log = lambda s: print(s, flush=True)  # noqa: E731
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    prompt_tokens = 128
    if a.smoke:
        a.device, a.steps, a.seq_len, a.batch, a.corpus_bytes = "cpu", a.steps or 40, 32, 8, 512 << 10
        a.eval_prompts, a.eval_tokens, prompt_tokens = min(a.eval_prompts, 2), min(a.eval_tokens, 32), 24
        t0 = time.perf_counter()
        a.target = str(_smoke_target(out, log, a.smoke_target_steps))
        log(f"  smoke target: {time.perf_counter() - t0:.1f} s")
        a.out = str(out / "eagle3")
    summary = train(a, log)
    if a.eval_prompts:
        from eagle3_accept import measure
        summary["accept"] = measure(a.target, a.out, k=a.k, prompts=a.eval_prompts, prompt_tokens=prompt_tokens,
                                    new_tokens=a.eval_tokens, device=a.device, log=log)
    summary.update(target=a.target, device=a.device, torch=torch.__version__)
    (Path(a.out) / "train_eagle3.json").write_text(json.dumps(summary, indent=1))
    log(f"wrote {a.out} (train_eagle3.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
