"""The tokenizer a GGUF file's metadata describes, built with the `tokenizers` library.

    tok = gguf_tokenizer(open_gguf("model.gguf"))     # graphrt.checkpoint.tokenizer.Tokenizer

A GGUF carries no tokenizer.json: llama.cpp stores the vocabulary (`tokenizer.ggml.tokens`, with
`token_type`), the BPE merges, the special token ids, `add_bos_token` / `add_eos_token`, the
pre-tokenizer's name (`tokenizer.ggml.pre`) and `tokenizer.chat_template`. For the byte-level BPE
of `tokenizer.ggml.model == "gpt2"` (SmolLM2, Qwen2/2.5/3, Llama 3) this builds the tokenizer
transformers' GGUF reader builds (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`), so the
ids and the chat template are the same:

- vocabulary: the tokens by id, a token spelled outside the byte-level alphabet re-spelled as its
  UTF-8 bytes in that alphabet; merges "a b" -> ("a", "b"); no unknown token;
- pre-tokenizer: the split regex of the vocabulary named by `tokenizer.ggml.pre` (Llama 3's,
  Qwen2's: PRE_SPLITS), then byte-level without its own regex; other names: GPT-2's byte-level
  pre-tokenizer; decoder: byte-level;
- control tokens (token_type 3) spelled in the byte-level alphabet are special added tokens,
  user-defined ones (4) plain added tokens; the named specials (bos / eos / unk / pad by id) are
  special added tokens too;
- BOS / EOS added by encode only when add_bos_token / add_eos_token say so (default: not).

Other tokenizer models (sentencepiece "llama", ...) go through transformers' GGUF reader, with a
warning line (imports transformers: seconds). Host only.
"""
from __future__ import annotations

import logging

from graphrt.checkpoint.gguf_file import GGUFFile
from graphrt.checkpoint.hf_files import CheckpointError, reading
from graphrt.checkpoint.tokenizer import Tokenizer

log = logging.getLogger(__name__)

CONTROL, USER_DEFINED = 3, 4                     # llama.cpp's token_type values
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.pre -> the split regex its merges were learned with (llama.cpp's names)
PRE_SPLITS = {name: _LLAMA3 for name in ("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "falcon3", "dbrx")} | \
             {name: _QWEN2 for name in ("qwen2", "deepseek-r1-qwen")}
NAMED = {"bos_token": "bos", "eos_token": "eos", "unk_token": "unknown", "pad_token": "padding"}


def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte-level spelling: byte -> character (printable Latin-1 bytes as themselves,
    the other 68 bytes as chr(256 + n) in byte order)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in out:
            out[b], extra = chr(256 + extra), extra + 1
    return out


def gguf_tokenizer(g: GGUFFile):
    """The tokenizer of GGUF file `g` (see the module doc): a `Tokenizer` for byte-level BPE,
    transformers' for other models. CheckpointError naming the key for missing or bad metadata."""
    model = g.get("tokenizer.ggml.model", str)
    if model != "gpt2":
        return _transformers_tokenizer(g, model)
    from tokenizers import AddedToken, Regex, decoders, pre_tokenizers, processors
    from tokenizers import Tokenizer as Backend
    from tokenizers.models import BPE
    tokens = g.get("tokenizer.ggml.tokens", list)
    types = g.get("tokenizer.ggml.token_type", list, [])
    merges = g.get("tokenizer.ggml.merges", list)
    if types and len(types) != len(tokens):
        raise CheckpointError(f"{g.file}: metadata 'tokenizer.ggml.token_type': {len(types)} entries for "
                              f"{len(tokens)} tokens")
    spelling = byte_alphabet()
    alphabet = set(spelling.values())
    vocab = {t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i
             for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ")) for m in merges]
    bad = next((m for m, p in zip(merges, pairs) if len(p) != 2), None)
    if bad is not None:
        raise CheckpointError(f"{g.file}: metadata 'tokenizer.ggml.merges': {bad!r} is not two tokens "
                              f"separated by one space")
    with reading(g.file, "tokenizer (vocabulary and merges)"):
        backend = Backend(BPE(vocab=vocab, merges=pairs, dropout=None, continuing_subword_prefix="",
                              end_of_word_suffix="", fuse_unk=False))
    split = PRE_SPLITS.get(g.get("tokenizer.ggml.pre", str, ""))
    if split is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    control = [AddedToken(t, normalized=False, special=True)
               for t, kind in zip(tokens, types) if kind == CONTROL and set(t) <= alphabet]
    if control:
        backend.add_special_tokens(control)
    user = [AddedToken(t, normalized=False, special=False)
            for t, kind in zip(tokens, types) if kind == USER_DEFINED and t in vocab]
    if user:
        backend.add_tokens(user)
    special = {}
    for name, key in NAMED.items():
        i = g.get(f"tokenizer.ggml.{key}_token_id", int, None)
        if i is None:
            continue
        if not 0 <= i < len(tokens):
            raise CheckpointError(f"{g.file}: metadata 'tokenizer.ggml.{key}_token_id': {i} is not in [0, {len(tokens)})")
        special[name] = tokens[i]
    added = set(backend.get_added_tokens_decoder().values())
    named = [AddedToken(t, normalized=False, special=True) for t in dict.fromkeys(special.values())
             if t not in {a.content for a in added}]
    if named:
        backend.add_special_tokens(named)
    add_bos = g.get("tokenizer.ggml.add_bos_token", bool, False) and "bos_token" in special
    add_eos = g.get("tokenizer.ggml.add_eos_token", bool, False) and "eos_token" in special
    bos, eos = special.get("bos_token"), special.get("eos_token")
    single = f"{bos + ':0 ' if add_bos else ''}$A:0{' ' + eos + ':0' if add_eos else ''}"
    pair = f"{single}{' ' + bos + ':1' if add_bos else ''} $B:1{' ' + eos + ':1' if add_eos else ''}"
    used = [(t, backend.token_to_id(t)) for t, on in ((bos, add_bos), (eos, add_eos)) if on]
    backend.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=used)
    return Tokenizer.from_backend(backend, special=special, name_or_path=str(g.file),
                                  chat_template=g.get("tokenizer.chat_template", str, None))


def _transformers_tokenizer(g: GGUFFile, model: str):
    log.warning("%s: tokenizer.ggml.model %r: loading the tokenizer through transformers' GGUF reader "
                "(imports transformers: seconds)", g.file, model)
    from transformers import AutoTokenizer
    with reading(g.file, f"tokenizer (tokenizer.ggml.model {model!r}, through transformers)"):
        return AutoTokenizer.from_pretrained(str(g.file.parent), gguf_file=g.file.name)


__all__ = ["PRE_SPLITS", "byte_alphabet", "gguf_tokenizer"]
