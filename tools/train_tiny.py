"""Train a small draft/target family on the Python standard library's source (no network).

    python tools/train_tiny.py --out DIR [--size micro|full] [--device cpu|cuda] [--steps N]
        [--models draft,target,target-qwen3] [--time-budget-s S] [--seed 0]

Corpus: every *.py file under `sysconfig.get_paths()["stdlib"]` of the running interpreter
(site-packages excluded), split by a hash of each file's relative path (`is_heldout`: about 5%
held out, fixed for a given path). A byte-level BPE (`tokenizers`, specials and a chat template)
is trained on the train split and shared by the family. Each model is a transformers
LlamaForCausalLM / Qwen3ForCausalLM built from a config and trained with a plain torch loop
(AdamW, linear warm-up then cosine, bf16 autocast on CUDA, gradient clipping, fixed seed; random
windows of the concatenated train stream, each file `<bos> text <eos>`). Without --steps the step
count is fitted to --time-budget-s from the measured time of the first steps (so it varies from
run to run; --steps N makes a run repeatable up to CUDA's non-deterministic kernels).

DIR gets tokenizer/ and one HF directory per model (config.json, generation_config.json,
model.safetensors in bf16, tokenizer files with the chat template) that
transformers.AutoModelForCausalLM and graphrt.LLM both load; train.json (summary: parameters,
steps, tokens, seconds, train/held-out loss per model and their curves) and, with matplotlib,
loss_curves.png. Prints a loss table.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
BOS, EOS = 0, 1
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
HELDOUT_PER_MILLE = 50   # ~5% of files


@dataclass(frozen=True)
class ModelShape:
    """One family member: architecture and geometry (head_dim 64: a graphrt attention size)."""
    arch: str                  # "llama" or "qwen3"
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    tied: bool
    lr: float


@dataclass(frozen=True)
class SizePreset:
    vocab: int
    seq_len: int
    batch: int
    tokenizer_bytes: int       # bytes of train text the BPE is trained on
    corpus_bytes: int | None   # bytes of train text tokenized for training (None: all)
    default_steps: int | None  # None: fit the steps to the time budget
    budget_s: dict             # model name -> seconds (when fitting steps)
    models: dict               # model name -> ModelShape


SIZES = {
    "full": SizePreset(8192, 1024, 32, 12 << 20, None, None,
                       {"draft": 15.0, "target": 85.0, "target-qwen3": 85.0},
                       {"draft": ModelShape("llama", 256, 768, 4, 4, 2, True, 3e-3),
                        "target": ModelShape("llama", 768, 2048, 12, 12, 4, False, 1.5e-3),
                        "target-qwen3": ModelShape("qwen3", 768, 2048, 12, 12, 4, False, 1.5e-3)}),
    "micro": SizePreset(512, 64, 8, 256 << 10, 512 << 10, 20,
                        {"draft": 10.0, "target": 10.0, "target-qwen3": 10.0},
                        {"draft": ModelShape("llama", 64, 128, 1, 1, 1, True, 3e-3),
                         "target": ModelShape("llama", 128, 256, 2, 2, 1, False, 3e-3),
                         "target-qwen3": ModelShape("qwen3", 128, 256, 2, 2, 1, False, 3e-3)}),
}


# ---- corpus -------------------------------------------------------------------------------------
def stdlib_files(root: Path | None = None) -> list[Path]:
    """Sorted relative paths of the stdlib's *.py files (site-/dist-packages excluded)."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    return sorted(p.relative_to(root) for p in root.rglob("*.py")
                  if not {"site-packages", "dist-packages", "__pycache__"} & set(p.relative_to(root).parts))


def is_heldout(rel: Path) -> bool:
    """The fixed split: a file is held out when a hash of its relative path says so (~5%)."""
    h = int.from_bytes(hashlib.sha256(rel.as_posix().encode()).digest()[:4], "little")
    return h % 1000 < HELDOUT_PER_MILLE


def read_split(heldout: bool, *, root: Path | None = None, max_bytes: int | None = None) -> list[tuple[str, str]]:
    """(relative path, text) of the train (or held-out) files in path order; with max_bytes, the
    files that fit in that many characters in all (taken in path order, skipping larger ones)."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    out, total = [], 0
    for rel in stdlib_files(root):
        if is_heldout(rel) != heldout:
            continue
        text = (root / rel).read_text(encoding="utf-8", errors="replace")
        if max_bytes is not None and total + len(text) > max_bytes:
            continue                                  # too big for what is left: try smaller files
        out.append((rel.as_posix(), text))
        total += len(text)
    return out


# ---- tokenizer ----------------------------------------------------------------------------------
def train_tokenizer(texts: list[str], out: Path, *, vocab: int, max_bytes: int):
    """Byte-level BPE of `vocab` ids (specials first: bos 0, eos 1) saved to `out`; returns the
    transformers fast tokenizer (chat template set)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    sample, total = [], 0
    for t in texts:
        if total >= max_bytes:
            break
        sample.append(t)
        total += len(t)
    tok.train_from_iterator(sample, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIALS[BOS], eos_token=SPECIALS[EOS],
                                   pad_token=SPECIALS[EOS])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    return fast


def encode_files(tok, texts: list[str]) -> list[list[int]]:
    """Each file as [bos] + ids + [eos]."""
    ids = tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    return [[BOS] + e.ids + [EOS] for e in ids]


# ---- model --------------------------------------------------------------------------------------
def build_model(shape: ModelShape, vocab: int, max_pos: int):
    """A freshly initialised transformers model of `shape` (float32 weights)."""
    import transformers
    common = dict(vocab_size=vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                  num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                  num_key_value_heads=shape.kv_heads, head_dim=64, rms_norm_eps=1e-5,
                  rope_theta=10000.0, max_position_embeddings=max_pos, tie_word_embeddings=shape.tied,
                  bos_token_id=BOS, eos_token_id=EOS, pad_token_id=EOS, attention_bias=False)
    if shape.arch == "qwen3":
        cfg = transformers.Qwen3Config(use_sliding_window=False, **common)
        cls = transformers.Qwen3ForCausalLM
    else:
        cfg = transformers.LlamaConfig(mlp_bias=False, **common)
        cls = transformers.LlamaForCausalLM
    cfg._attn_implementation = "sdpa"
    return cls(cfg)


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up to `peak`, then cosine to peak / 10 at `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac)))


class Windows:
    """Random [batch, seq_len + 1] windows of one token stream (on the training device)."""

    def __init__(self, stream: torch.Tensor, seq_len: int, batch: int, seed: int):
        if stream.numel() <= seq_len + 1:
            raise ValueError(f"corpus: {stream.numel()} tokens, need more than seq_len + 1 = {seq_len + 1}")
        self.stream, self.seq_len, self.batch = stream, seq_len, batch
        self.gen = torch.Generator().manual_seed(seed)
        self.offs = torch.arange(seq_len + 1, device=stream.device)

    def next(self) -> torch.Tensor:
        starts = torch.randint(0, self.stream.numel() - self.seq_len - 1, (self.batch, 1), generator=self.gen)
        return self.stream[starts.to(self.stream.device) + self.offs]            # [B, L + 1] int64


def loss_of(model, batch: torch.Tensor, autocast: bool) -> torch.Tensor:
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=batch[:, :-1], use_cache=False).logits
    return F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())


@torch.no_grad()
def heldout_loss(model, batches: list[torch.Tensor], autocast: bool) -> float:
    model.eval()
    out = sum(float(loss_of(model, b, autocast)) for b in batches) / len(batches)
    model.train()
    return out


def train_one(name: str, shape: ModelShape, preset: SizePreset, train: torch.Tensor, val: list[torch.Tensor],
              *, device: torch.device, steps: int | None, budget_s: float, seed: int, log) -> tuple:
    """Train one model; returns (model, summary dict)."""
    torch.manual_seed(seed)
    model = build_model(shape, preset.vocab, max(256, preset.seq_len)).to(device)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    cuda = device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=shape.lr, betas=(0.9, 0.95), weight_decay=0.1,
                            **({"fused": True} if cuda else {}))
    data = Windows(train, preset.seq_len, preset.batch, seed + 1)
    warmup, probe = (30 if steps is None else min(30, max(1, steps // 10))), 5
    total = steps or 10**9
    curve, t0, t_probe = [], time.perf_counter(), None
    eval_every = None
    step = 0
    while step < total:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, shape.lr, warmup)
        loss = loss_of(model, data.next(), cuda)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if steps is None and step == 2:           # after the first (warm-up) steps: time the next
            if cuda:
                torch.cuda.synchronize()
            t_probe = time.perf_counter()
        if steps is None and step == 2 + probe:
            if cuda:
                torch.cuda.synchronize()
            per_step = (time.perf_counter() - t_probe) / probe
            left = budget_s - (time.perf_counter() - t0)
            total = max(step + 1, step + int(left * 0.93 / per_step))  # ~7% kept for held-out evals
            log(f"  {name}: {per_step * 1e3:.1f} ms/step -> {total} steps in {budget_s:.0f} s")
        if eval_every is None and total < 10**9:
            eval_every = max(1, total // (10 if preset.default_steps is None else 4))
        if eval_every and (step % eval_every == 0 or step == total):
            curve.append({"step": step, "train_loss": float(loss.detach()), "heldout_loss": heldout_loss(model, val, cuda),
                          "s": round(time.perf_counter() - t0, 2)})
        if steps is None and time.perf_counter() - t0 > budget_s * 1.15:
            log(f"  {name}: over the time budget at step {step}; stopping")
            break
    if cuda:
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    if not curve or curve[-1]["step"] != step:
        curve.append({"step": step, "train_loss": float(loss.detach()), "heldout_loss": heldout_loss(model, val, cuda),
                      "s": round(secs, 2)})
    return model, {"name": name, "shape": asdict(shape), "params": params, "steps": step,
                   "tokens": step * preset.batch * preset.seq_len, "train_s": round(secs, 2),
                   "train_loss": curve[-1]["train_loss"], "heldout_loss": curve[-1]["heldout_loss"],
                   "heldout_ppl_windows": math.exp(curve[-1]["heldout_loss"]), "curve": curve}


def save_model(model, tok, out: Path) -> None:
    """HF directory in bf16 + generation_config + tokenizer files (chat template)."""
    from transformers import GenerationConfig
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.generation_config = GenerationConfig(bos_token_id=BOS, eos_token_id=EOS, pad_token_id=EOS)
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    cfg_file = out / "tokenizer_config.json"      # the template also inside tokenizer_config.json
    cfg = json.loads(cfg_file.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_file.write_text(json.dumps(cfg, indent=2))


def plot(summaries: list[dict], png: Path) -> str:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib missing: no PNG written"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, s in enumerate(summaries):
        xs = [c["step"] for c in s["curve"]]
        ax.plot(xs, [c["train_loss"] for c in s["curve"]], "--", color=f"C{i}", label=f"{s['name']} train")
        ax.plot(xs, [c["heldout_loss"] for c in s["curve"]], "-o", color=f"C{i}", ms=3,
                label=f"{s['name']} held-out")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title("train_tiny: Python stdlib corpus")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    return f"wrote {png}"


def parse_budgets(text: str | None, names: list[str]) -> dict:
    """'S' (every model) or 'NAME=S,...' -> {name: seconds > 0}; ValueError naming the problem."""
    if text is None:
        return {}
    try:
        if "=" not in text:
            out = dict.fromkeys(names, float(text))
        else:
            out = {k.strip(): float(v) for k, v in (item.split("=", 1) for item in text.split(",") if item)}
    except ValueError:
        raise ValueError(f"{text!r} is not S or NAME=S,... with numbers") from None
    bad = [k for k in out if k not in names] + [k for k, v in out.items() if not v > 0]
    if bad:
        raise ValueError(f"{bad}: unknown model or not > 0 (models {names})")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--size", default="full", choices=sorted(SIZES))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--steps", type=int, default=None, help="steps per model (default: fit the time budget)")
    p.add_argument("--models", default="draft,target,target-qwen3")
    p.add_argument("--time-budget-s", default=None, help="seconds per model: S for all, or NAME=S,... "
                   "(default: the size's, e.g. draft=15,target=85,target-qwen3=85)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    preset = SIZES[a.size]
    names = [m for m in a.models.split(",") if m]
    bad = [m for m in names if m not in preset.models]
    if not names or bad:
        print(f"train_tiny: --models {a.models!r}: unknown {bad}; choose from {sorted(preset.models)}", file=sys.stderr)
        return 2
    budgets = dict(preset.budget_s)
    try:
        budgets.update(parse_budgets(a.time_budget_s, list(preset.models)))
    except ValueError as e:
        print(f"train_tiny: --time-budget-s: {e}", file=sys.stderr)
        return 2
    if a.steps is not None and a.steps < 1:
        print(f"train_tiny: --steps must be >= 1, got {a.steps}", file=sys.stderr)
        return 2
    if a.device == "cuda" and not torch.cuda.is_available():
        print("train_tiny: --device cuda but CUDA is not available; use --device cpu", file=sys.stderr)
        return 2
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True     # training only; restored on return
    try:
        return _train(a, preset, names, budgets)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def _train(a, preset: SizePreset, names: list[str], budgets: dict) -> int:
    device, out = torch.device(a.device), Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    steps = a.steps or preset.default_steps
    log = lambda s: print(s, flush=True)  # noqa: E731
    t_all = time.perf_counter()
    train_files = read_split(False, max_bytes=preset.corpus_bytes)
    val_files = read_split(True, max_bytes=None if preset.corpus_bytes is None else preset.corpus_bytes // 8)
    texts = [t for _, t in train_files]
    tok = train_tokenizer(texts, out / "tokenizer", vocab=preset.vocab, max_bytes=preset.tokenizer_bytes)
    train_ids, val_ids = encode_files(tok, texts), encode_files(tok, [t for _, t in val_files])
    stream = torch.tensor([i for f in train_ids for i in f], dtype=torch.int64, device=device)
    val_stream = torch.tensor([i for f in val_ids for i in f], dtype=torch.int64, device=device)
    vw = Windows(val_stream, preset.seq_len, preset.batch, a.seed + 7)
    val = [vw.next() for _ in range(4 if a.size == "full" else 1)]   # fixed held-out windows (curves)
    prep_s = time.perf_counter() - t_all
    log(f"corpus: {len(train_files)} train files ({stream.numel()} tokens), {len(val_files)} held-out "
        f"({val_stream.numel()} tokens), vocab {len(tok)}; tokenizer + encoding {prep_s:.1f} s")
    summaries = []
    for i, name in enumerate(names):
        shape = preset.models[name]
        budget = budgets[name]
        model, summ = train_one(name, shape, preset, stream, val, device=device, steps=steps,
                                budget_s=budget, seed=a.seed + 100 * i, log=log)
        save_model(model, tok, out / name)
        del model
        summaries.append(summ)
        log(f"  {name}: {summ['params'] / 1e6:.2f} M params, {summ['steps']} steps, "
            f"{summ['tokens'] / 1e6:.1f} M tokens, {summ['train_s']:.1f} s -> {out / name}")
    log(f"\n{'model':<14}{'params':>10}{'steps':>8}{'tokens':>10}{'secs':>8}{'train':>8}{'held-out':>10}{'ppl':>8}")
    for s in summaries:
        log(f"{s['name']:<14}{s['params'] / 1e6:>9.2f}M{s['steps']:>8}{s['tokens'] / 1e6:>9.1f}M"
            f"{s['train_s']:>8.1f}{s['train_loss']:>8.3f}{s['heldout_loss']:>10.3f}{s['heldout_ppl_windows']:>8.2f}")
    note = plot(summaries, out / "loss_curves.png")
    log(note)
    total_s = time.perf_counter() - t_all
    summary = {"size": a.size, "device": str(device), "seed": a.seed, "vocab": len(tok),
               "seq_len": preset.seq_len, "batch": preset.batch, "train_files": len(train_files),
               "heldout_files": len(val_files), "train_tokens": stream.numel(),
               "heldout_tokens": val_stream.numel(), "prep_s": round(prep_s, 2), "total_s": round(total_s, 2),
               "torch": torch.__version__, "png": note, "models": summaries}
    (out / "train.json").write_text(json.dumps(summary, indent=1))
    log(f"total {total_s:.1f} s; wrote {out / 'train.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
