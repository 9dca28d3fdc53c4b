"""Write a random-weight checkpoint in the HF layout, with a real tokenizer built locally.

    python tools/make_checkpoint.py DIR --shape {tiny,llama-3.2-1b,llama-3.1-8b,qwen3-8b}
        [--arch llama|qwen2|qwen3 (tiny only)] [--dtype bfloat16] [--max-shard-mb N] [--seed S]
        [--tokenizer-vocab N] [--device cpu|cuda]

DIR gets config.json, generation_config.json, model.safetensors (or shards plus
model.safetensors.index.json), and tokenizer files with a chat template: a byte-level BPE trained
with `tokenizers` on text this script generates (no network). Tensors are drawn one at a time
(N(0, 0.02), norms near 1) and written by safetensors, so large shapes need no HF model in memory.
The tiny shape's vocabulary is the tokenizer's, so every id decodes to text.
--tokenizer-vocab N beyond what the generated text trains (a few thousand): a byte-level BPE of
N tokens built from generated merges instead (N = 128000: a tokenizer.json of Llama 3's size, for
start-up timing). --device cuda draws the tensors on the GPU (other random values than the
CPU's for the same seed; the 8B shape in seconds instead of minutes).
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
from pathlib import Path

import torch

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>",
            "<|endoftext|>"]  # the last: transformers maps qwen2 to a class that adds it
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
# hidden, intermediate, layers, q heads, kv heads, head_dim, vocab (None: tokenizer's), tied, theta
SHAPES = {
    "tiny": (128, 256, 2, 2, 1, 64, None, False, 10000.0),
    "tiny-gqa": (128, 256, 2, 4, 2, 64, 384, False, 10000.0),   # divisible by tensor_parallel=2
    "smollm2-135m": (576, 1536, 30, 9, 3, 64, 49152, True, 100000.0),   # SmolLM2-135M's geometry
    "llama-3.2-1b": (2048, 8192, 16, 32, 8, 64, 128256, True, 500000.0),
    "llama-3.1-8b": (4096, 14336, 32, 32, 8, 128, 128256, False, 500000.0),
    "qwen3-8b": (4096, 12288, 36, 32, 8, 128, 151936, False, 1000000.0),
}
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}


def _corpus(seed: int, lines: int = 3000) -> list[str]:
    rng = random.Random(seed)
    syll = ["ka", "lo", "mi", "ne", "ru", "so", "ta", "vi", "an", "el", "or", "ut", "is", "em", "py"]
    words = ["".join(rng.choice(syll) for _ in range(rng.randint(1, 3))) for _ in range(400)]
    words += ["the", "a", "is", "of", "and", "to", "Hello", "world", "graph", "token", "!", ",", "."]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 14))) for _ in range(lines)]


TRAINED_VOCAB_MAX = 8192   # the generated corpus trains about this many tokens at most


def synthetic_bpe(vocab_size: int, seed: int = 0) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A byte-level BPE of vocab_size tokens without training: SPECIALS (ids 0..6, as the trained
    one has them), the 256 byte characters, then merges of a random token with a byte character
    whose result is new (every merge's parts and result are in the vocabulary: a valid model)."""
    from tokenizers import pre_tokenizers
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    rng = random.Random(seed)
    tokens = list(alphabet)
    vocab = {t: i for i, t in enumerate(SPECIALS + tokens)}
    merges = []
    while len(vocab) < vocab_size:
        a, b = rng.choice(tokens[-4096:] if rng.random() < 0.5 else tokens), rng.choice(alphabet)
        if len(a) < 16 and a + b not in vocab:
            vocab[a + b] = len(vocab)
            tokens.append(a + b)
            merges.append((a, b))
    return vocab, merges


def build_tokenizer(out: Path, *, vocab_size: int, seed: int = 0):
    """Train a byte-level BPE of `vocab_size` tokens (specials included), save it to `out`;
    above TRAINED_VOCAB_MAX the BPE is synthetic_bpe's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    synthetic = vocab_size > TRAINED_VOCAB_MAX
    tok = Tokenizer(models.BPE(*synthetic_bpe(vocab_size, seed)) if synthetic else models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if synthetic:
        tok.add_special_tokens(SPECIALS)              # already in the vocabulary: ids 0..6
    else:
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIALS[0], eos_token=SPECIALS[1],
                                   pad_token=SPECIALS[1])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    return fast


def hf_config(shape: str, arch: str, vocab: int, dtype: str, num_layers: int | None = None) -> dict:
    h, inter, layers, hq, hkv, d, _, tied, theta = SHAPES[shape]
    layers = num_layers or layers
    cfg = {"architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                              "qwen3": "Qwen3ForCausalLM"}[arch]],
           "model_type": arch, "vocab_size": vocab, "hidden_size": h, "intermediate_size": inter,
           "num_hidden_layers": layers, "num_attention_heads": hq, "num_key_value_heads": hkv,
           "head_dim": d, "rms_norm_eps": 1e-5, "rope_theta": theta, "tie_word_embeddings": tied,
           "max_position_embeddings": 256 if shape.startswith("tiny") else 131072, "hidden_act": "silu",
           "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": dtype, "dtype": dtype}
    if arch == "llama":                       # Llama 3.x frequency scaling (tiny: a short original)
        cfg["attention_bias"] = False
        cfg["rope_scaling"] = dict(LLAMA3_ROPE, factor=32.0 if shape == "llama-3.2-1b" else 8.0)
        if shape.startswith("tiny"):
            cfg["rope_scaling"]["original_max_position_embeddings"] = 64
    return cfg


def _tensors(cfg: dict, arch: str):
    """(name, shape, kind) of every tensor; kind 'w' (N(0, 0.02)), 'norm' (1 + N(0, 0.1)), 'b'."""
    h, inter, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    yield "model.embed_tokens.weight", (cfg["vocab_size"], h), "w"
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (h,), "norm"
        for n, rows in (("q", q), ("k", kv), ("v", kv)):
            yield p + f"self_attn.{n}_proj.weight", (rows, h), "w"
            if arch == "qwen2":
                yield p + f"self_attn.{n}_proj.bias", (rows,), "b"
        if arch == "qwen3":
            yield p + "self_attn.q_norm.weight", (d,), "norm"
            yield p + "self_attn.k_norm.weight", (d,), "norm"
        yield p + "self_attn.o_proj.weight", (h, q), "w"
        yield p + "post_attention_layernorm.weight", (h,), "norm"
        yield p + "mlp.gate_proj.weight", (inter, h), "w"
        yield p + "mlp.up_proj.weight", (inter, h), "w"
        yield p + "mlp.down_proj.weight", (h, inter), "w"
    yield "model.norm.weight", (h,), "norm"
    if not cfg["tie_word_embeddings"]:
        yield "lm_head.weight", (cfg["vocab_size"], h), "w"


def write_checkpoint(out, shape: str = "tiny", *, arch: str = "llama", dtype: str = "bfloat16",
                     max_shard_mb: float | None = None, seed: int = 0, tokenizer_vocab: int = 384,
                     num_layers: int | None = None, lm_head_from_embed: bool = False,
                     residual_scale: float = 1.0, device: str = "cpu", tokenizer_from=None) -> Path:
    """Write the checkpoint into `out` (created); returns its path. num_layers: fewer layers
    than the shape's (a shape-like small model). device: where the tensors are drawn ("cuda":
    fast for the large shapes; other values than the CPU's for one seed). tokenizer_from: a
    checkpoint directory whose tokenizer files are copied instead of building one.

    A model whose greedy output repeats tokens (a draft proposing the last token is then
    accepted): lm_head_from_embed (an untied shape's lm_head.weight holds a copy of
    embed_tokens.weight) with residual_scale < 1 (o_proj and down_proj drawn that much smaller:
    the residual stream stays near the current token's embedding, which lm_head reads back).
    At the 8B shape a random model of the defaults never repeats a token greedily."""
    from safetensors.torch import save_file
    if shape not in SHAPES:
        raise ValueError(f"shape: {shape!r} is not one of {sorted(SHAPES)}")
    if arch not in ("llama", "qwen2", "qwen3"):
        raise ValueError(f"arch: {arch!r} is not one of ['llama', 'qwen2', 'qwen3']")
    if lm_head_from_embed and SHAPES[shape][7]:
        raise ValueError(f"lm_head_from_embed: shape {shape!r} ties its embeddings (it has no lm_head.weight)")
    if not 0 < residual_scale <= 1:
        raise ValueError(f"residual_scale: {residual_scale} is not in (0, 1]")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if tokenizer_from is not None:
        from transformers import AutoTokenizer
        for f in Path(tokenizer_from).iterdir():
            if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
                shutil.copyfile(f, out / f.name)
        tok = AutoTokenizer.from_pretrained(str(out))
    else:
        tok = build_tokenizer(out, vocab_size=tokenizer_vocab, seed=seed)
    vocab = SHAPES[shape][6] or len(tok)
    cfg = hf_config(shape, arch, vocab, dtype, num_layers)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))
    gen = torch.Generator(device=device).manual_seed(seed)
    tdtype, limit = getattr(torch, dtype), (max_shard_mb or float("inf")) * 2**20
    shards, cur, size = [], {}, 0
    embed = None
    for name, shp, kind in _tensors(cfg, arch):
        if name == "lm_head.weight" and lm_head_from_embed:
            t = embed.clone()                          # a copy: safetensors stores no shared tensors
        else:
            std = 0.02 * (residual_scale if name.endswith(("o_proj.weight", "down_proj.weight")) else 1.0)
            t = torch.randn(shp, generator=gen, device=device) * (0.1 if kind == "norm" else std)
            t = (t + 1.0 if kind == "norm" else t).to(tdtype).cpu()
        if name == "model.embed_tokens.weight":
            embed = t
        nbytes = t.numel() * t.element_size()
        if cur and size + nbytes > limit:
            shards.append(cur)
            cur, size = {}, 0
        cur[name], size = t, size + nbytes
    shards.append(cur)
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata={"format": "pt"})
        return out
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        weight_map |= {name: fname for name in shard}
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir")
    p.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    p.add_argument("--arch", default=None, choices=["llama", "qwen2", "qwen3"])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--max-shard-mb", type=float, default=4096.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=None, help="fewer layers than the shape's")
    p.add_argument("--tokenizer-vocab", type=int, default=None, metavar="N",
                   help="tokens of the tokenizer (default: 384 for tiny, else 4096; at most the shape's vocab)")
    p.add_argument("--device", default="cpu", help="where tensors are drawn (cuda: fast, other values)")
    p.add_argument("--tokenizer-from", default=None, metavar="DIR",
                   help="copy this checkpoint's tokenizer files instead of building a tokenizer")
    a = p.parse_args(argv)
    arch = a.arch or ("qwen3" if a.shape.startswith("qwen3") else "llama")
    if a.shape != "tiny" and arch != ("qwen3" if a.shape.startswith("qwen3") else "llama"):
        p.error(f"--arch {arch} does not fit --shape {a.shape}")
    out = write_checkpoint(a.dir, a.shape, arch=arch, dtype=a.dtype, max_shard_mb=a.max_shard_mb,
                           seed=a.seed, num_layers=a.layers, device=a.device, tokenizer_from=a.tokenizer_from,
                           tokenizer_vocab=a.tokenizer_vocab or (384 if a.shape == "tiny" else 4096))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
