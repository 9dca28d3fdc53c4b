"""A checkpoint's tokenizer from tokenizer.json (the `tokenizers` library) without transformers.

    tok = load_tokenizer(path)           # Tokenizer, or transformers' AutoTokenizer (no tokenizer.json)
    ids = tok(text).input_ids            # as transformers: the post-processor's specials added
    text = tok.decode(ids, skip_special_tokens=True)
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)

`Tokenizer` answers what graphrt and its users call on a transformers tokenizer, with the same
results as transformers 5 for a tokenizer.json checkpoint: encode / __call__ / decode /
convert_ids_to_tokens / convert_tokens_to_ids / len / vocab_size / get_vocab / add_tokens, the
special tokens (bos / eos / unk / pad / ...: text, id, all_special_ids, special_tokens_map),
`chat_template` (readable and settable) and `apply_chat_template`, `backend_tokenizer` and
`clean_up_tokenization_spaces` (the detokenizer's fast paths). What transformers 5 does with
these files, and so this class: tokenizer.json's post-processor decides which special tokens
encode adds (tokenizer_config.json's add_bos_token / add_eos_token are not read when there is a
tokenizer.json); special tokens named in tokenizer_config.json that tokenizer.json lacks are
added as special tokens; chat_template.jinja wins over tokenizer_config.json's chat_template (a
list of named templates: the one named "default"); clean_up_tokenization_spaces applies to
non-BPE models only.
"""
from __future__ import annotations

import logging
from pathlib import Path

from graphrt.checkpoint.chat_template import ChatTemplate
from graphrt.checkpoint.hf_files import CheckpointError, check_size, present, read_json, reading

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _content(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    if value is not None and not isinstance(value, str):
        raise ValueError(f"expected a string or {{'content': ...}}, got {value!r}")
    return value


def _clean_up(text: str) -> str:
    """transformers' clean_up_tokenization: no space before punctuation and English contractions."""
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                 (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(a, b)
    return text


class Encoding(dict):
    """`tok(text)`'s result: {"input_ids": [...]}, also as `.input_ids` (transformers' BatchEncoding)."""

    @property
    def input_ids(self) -> list[int]:
        return self["input_ids"]


def _template_source(path: Path, config: dict):
    """chat_template.jinja, else tokenizer_config.json's chat_template (a string, or a list of
    {"name", "template"}: a dict by name), else None."""
    jinja = path / "chat_template.jinja"
    if present(jinja):
        check_size(jinja)
        with reading(jinja, "chat template"):
            return jinja.read_text(encoding="utf-8")
    source = config.get("chat_template")
    if isinstance(source, list):
        source = {t["name"]: t["template"] for t in source}
    return source



def backend_encoding(backend, text: str, add_special_tokens: bool = True):
    """The `tokenizers` backend's Encoding of one text: the one encode call graphrt makes (the
    batch call releases the GIL; the fast one keeps no offsets). Also the tokenizer process's
    (serve/tokenizer_process.py), so both give the same ids."""
    return backend.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0]

class Tokenizer:
    """tokenizer.json + tokenizer_config.json (see the module doc). Host only. encode and decode
    go through the backend's batch calls, which release the GIL while the Rust code runs
    (`tokenizers`' single-text `encode` / `decode` hold it for the whole call: seconds for a
    megabyte prompt, during which no other Python thread of the process, e.g. a server's event
    loop, runs); encode through `encode_batch_fast`, whose Encoding keeps no offsets (freeing a
    full Encoding holds the GIL: 0.3 s for a 4 MB prompt's)."""

    def __init__(self, path):
        from tokenizers import AddedToken
        from tokenizers import Tokenizer as Backend
        path = Path(path)
        config = read_json(path / "tokenizer_config.json") if present(path / "tokenizer_config.json") else {}
        special_map = path / "special_tokens_map.json"
        specials = read_json(special_map) if present(special_map) else {}
        check_size(path / "tokenizer.json")                # before the backend parses it
        with reading(path / "tokenizer.json", "tokenizer"):
            try:
                self._backend = Backend.from_file(str(path / "tokenizer.json"))
            except Exception:
                read_json(path / "tokenizer.json")   # invalid JSON: say where, in one line
                raise
        where = path / "tokenizer_config.json"
        with reading(where):
            self._special = {}
            for name in SPECIAL_TOKENS:
                value = _content(config.get(name, specials.get(name)))
                if value is not None:
                    self._special[name] = value
            known = self._backend.get_vocab(with_added_tokens=True)
            declared = config.get("added_tokens_decoder") or {}
            missing = [AddedToken(t["content"], special=bool(t.get("special", True)), lstrip=bool(t.get("lstrip")),
                                  rstrip=bool(t.get("rstrip")), single_word=bool(t.get("single_word")),
                                  normalized=bool(t.get("normalized", False)))
                       for _, t in sorted(declared.items(), key=lambda kv: int(kv[0])) if t["content"] not in known]
            extra = config.get("extra_special_tokens", config.get("additional_special_tokens")) or []
            if isinstance(extra, dict):
                extra = list(extra.values())
            self._extra = [_content(t) for t in extra]
            names = {str(t) for t in missing}
            missing += [AddedToken(t, special=True, normalized=False)
                        for t in list(self._special.values()) + self._extra if t not in known and t not in names]
            if missing:
                self._backend.add_tokens(missing)
            self.chat_template = _template_source(path, config)
        self.name_or_path = str(path)
        cleanup = bool(config.get("clean_up_tokenization_spaces", False))
        self.clean_up_tokenization_spaces = cleanup and type(self._backend.model).__name__ != "BPE"
        self._compiled: tuple[str, ChatTemplate] | None = None

    @classmethod
    def from_backend(cls, backend, *, special: dict[str, str], chat_template, name_or_path: str) -> "Tokenizer":
        """A Tokenizer over a built `tokenizers.Tokenizer` (a GGUF file's: gguf_tokenizer.py);
        special: {"bos_token": text, ...} for the named special tokens that are set (each already
        in the backend's vocabulary); chat_template: its Jinja source or None."""
        self = cls.__new__(cls)
        self._backend, self._special, self._extra = backend, dict(special), []
        self.chat_template, self.name_or_path = chat_template, name_or_path
        self.clean_up_tokenization_spaces = False
        self._compiled = None
        return self

    # --- the backend and sizes
    @property
    def backend_tokenizer(self):
        """The `tokenizers.Tokenizer` (its decoder and vocabulary: graphrt/engine/token_bytes.py)."""
        return self._backend

    def __len__(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def vocab_size(self) -> int:
        """The base vocabulary (without added tokens)."""
        return self._backend.get_vocab_size(with_added_tokens=False)

    def get_vocab(self) -> dict[str, int]:
        return self._backend.get_vocab(with_added_tokens=True)

    def add_tokens(self, tokens, special_tokens: bool = False) -> int:
        """Add tokens (strings or tokenizers.AddedToken) to the vocabulary; returns how many were new."""
        if special_tokens:
            return self._backend.add_special_tokens(list(tokens))
        return self._backend.add_tokens(list(tokens))

    # --- special tokens
    def __getattr__(self, name):
        base = name[:-3] if name.endswith("_id") else name
        if base in SPECIAL_TOKENS:             # bos_token, eos_token_id, ...: None when not set
            text = self.__dict__.get("_special", {}).get(base)
            return text if base == name or text is None else self._backend.token_to_id(text)
        raise AttributeError(name)

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """The named special tokens that are set, by attribute name (bos_token, ...)."""
        return dict(self._special)

    @property
    def all_special_tokens(self) -> list[str]:
        return list(dict.fromkeys(list(self._special.values()) + self._extra))

    @property
    def all_special_ids(self) -> list[int]:
        return self.convert_tokens_to_ids(self.all_special_tokens)

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            return self._backend.token_to_id(tokens)
        return [self._backend.token_to_id(t) for t in tokens]

    def convert_ids_to_tokens(self, ids, skip_special_tokens: bool = False):
        if isinstance(ids, int):
            return self._backend.id_to_token(ids)
        special = set(self.all_special_ids) if skip_special_tokens else ()
        return [self._backend.id_to_token(i) for i in ids if i not in special]

    # --- text <-> ids
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return backend_encoding(self._backend, text, add_special_tokens).ids

    def __call__(self, text: str, add_special_tokens: bool = True) -> Encoding:
        return Encoding(input_ids=self.encode(text, add_special_tokens))

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        text = self._backend.decode_batch([[ids] if isinstance(ids, int) else list(ids)],
                                          skip_special_tokens=skip_special_tokens)[0]
        return _clean_up(text) if self.clean_up_tokenization_spaces else text

    # --- chat
    def apply_chat_template(self, conversation, *, add_generation_prompt: bool = False, tokenize: bool = True,
                            return_dict: bool = False, chat_template: str | None = None, tools=None,
                            documents=None, **kwargs):
        """The conversation through the chat template (transformers' variables: messages,
        add_generation_prompt, tools, documents, the special tokens' text, then kwargs). tokenize:
        the text's ids without the post-processor's specials (the template writes them);
        return_dict: {"input_ids": ids} instead of the list."""
        source = self._source(chat_template, tools)
        if not conversation:
            raise ValueError("messages: the conversation is empty")
        if self._compiled is None or self._compiled[0] != source:
            self._compiled = (source, ChatTemplate(source))
        text = self._compiled[1].render(conversation, add_generation_prompt=add_generation_prompt, tools=tools,
                                        documents=documents, **{**self._special, **kwargs})
        if not tokenize:
            return text
        ids = self.encode(text, add_special_tokens=False)
        return Encoding(input_ids=ids) if return_dict else ids

    def _source(self, chat_template, tools) -> str:
        named = self.chat_template
        if isinstance(named, dict):
            if chat_template in named:
                return named[chat_template]
            if chat_template is None:
                key = "tool_use" if tools is not None and "tool_use" in named else "default"
                if key not in named:
                    raise ValueError(f"chat_template: several templates and none named 'default': {sorted(named)}")
                return named[key]
        if chat_template is not None:
            return chat_template
        if not named:
            raise ValueError("chat_template: the tokenizer has no chat template")
        return named


def load_tokenizer(path):
    """The checkpoint's tokenizer (a GGUF file's: loader.load_tokenizer): `Tokenizer` when it
    has tokenizer.json; otherwise (a
    sentencepiece tokenizer.model, vocab.json + merges.txt) transformers' AutoTokenizer, with a
    warning line saying so. CheckpointError (one line naming the file) for unreadable files, a
    symlink loop, or a file over its size cap (hf_files.MAX_BYTES)."""
    path = Path(path)
    found = [f for f in ("tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt") if present(path / f)]
    if not set(found) - {"merges.txt"}:
        raise CheckpointError(f"{path}: no tokenizer files (tokenizer.json, tokenizer.model or vocab.json)")
    for name in found:
        check_size(path / name)                        # one line naming the file and its cap
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if present(path / name):
            read_json(path / name)                     # one line naming the file, line and column
    if "tokenizer.json" in found:
        return Tokenizer(path)
    log.warning("%s: no tokenizer.json; loading the tokenizer through transformers' AutoTokenizer "
                "(imports transformers: seconds)", path)
    from transformers import AutoTokenizer
    with reading(path, "tokenizer"):
        return AutoTokenizer.from_pretrained(str(path))


__all__ = ["Encoding", "Tokenizer", "backend_encoding", "load_tokenizer"]
