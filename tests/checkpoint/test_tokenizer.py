"""graphrt/checkpoint/tokenizer.py + chat_template.py: tokenizer.json and tokenizer_config.json read without
transformers give what transformers' AutoTokenizer gives (ids, text, special tokens, chat
template output, the detokenizer's incremental text), for make_checkpoint's tokenizer and a
Llama-3-like one (a BOS post-processor, a system-message template, a pad token missing from
tokenizer.json); no tokenizer.json falls back to AutoTokenizer with a warning."""
from __future__ import annotations

import json
import logging
import random

import pytest

from _checkpoints import make_checkpoint_module
from graphrt.engine.detokenizer import TextState, make_decoder
from graphrt.engine.token_bytes import token_bytes
from graphrt.checkpoint.tokenizer import Tokenizer, load_tokenizer

transformers = pytest.importorskip("transformers")
jinja2 = pytest.importorskip("jinja2")

LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                   "<|eot_id|>", "<|python_tag|>"]
# the shape of Llama 3's template: bos, an optional system message, headers, tools as JSON,
# raise_exception for a role it does not know, namespace, trim
LLAMA3_TEMPLATE = (
    "{{- bos_token }}\n"
    "{%- set ns = namespace(system='') %}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set ns.system = messages[0]['content'] | trim %}\n"
    "    {%- set messages = messages[1:] %}\n"
    "{%- endif %}\n"
    "{%- if ns.system or tools is not none %}\n"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + ns.system }}\n"
    "{%- if tools is not none %}{{- '\\nTools: ' + (tools | tojson(indent=2)) }}{%- endif %}\n"
    "{{- '<|eot_id|>' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if message['role'] not in ('user', 'assistant') %}\n"
    "        {{- raise_exception('role ' + message['role'] + ' is not supported') }}\n"
    "    {%- endif %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n")
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_TEMPLATE = (
    "{%- for message in messages %}\n"
    "{%- if loop.first and message['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}\n"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}\n")
TEXTS = ["Hello world", "the graph token, is a: test!", "  leading spaces\n\ttabs and\r\nnewlines  ",
         "caf\u00e9 \u4e2d\u6587 \U0001f916 \u2192 \u00df", "<|eot_id|>special<|begin_of_text|> inside", "", "a" * 300,
         "don't I'm we're ."]
CONVERSATIONS = [
    [{"role": "user", "content": "Hi there"}],
    [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Why is the sky blue? \u00e9\u4e2d"}],
    [{"role": "system", "content": "sys"}, {"role": "user", "content": "q1"},
     {"role": "assistant", "content": "a1 \U0001f916"}, {"role": "user", "content": "q2"}],
    [{"role": "user", "content": "tool?", "tool_calls": None}],
]


def _llama3_like(d):
    """A byte-level BPE saved as tokenizer.json with a BOS-adding post-processor, and a
    tokenizer_config.json carrying Llama 3's special-token fields and a template like its."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers, processors
    vocab, merges = make_checkpoint_module().synthetic_bpe(1200, seed=5)
    tok = Backend(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(LLAMA3_SPECIALS)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                                       special_tokens=[("<|begin_of_text|>", bos)])
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    added = {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                       "single_word": False, "special": True} for t in LLAMA3_SPECIALS}
    (d / "tokenizer_config.json").write_text(json.dumps({
        "added_tokens_decoder": added, "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
        "pad_token": {"__type": "AddedToken", "content": "<|finetune_right_pad_id|>", "lstrip": False,
                      "normalized": False, "rstrip": False, "single_word": False, "special": True},   # not in tokenizer.json
        "chat_template": LLAMA3_TEMPLATE, "clean_up_tokenization_spaces": True, "add_bos_token": True,
        "model_input_names": ["input_ids", "attention_mask"], "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast"}))
    return d


def _qwen2_like(d):
    """A tokenizer.json as Qwen2.5's is built (NFC, its split regex, byte level, no post-processor
    specials) with a Qwen2Tokenizer tokenizer_config.json (no bos, <|im_end|> eos, null unk)."""
    from tokenizers import Regex, Tokenizer as Backend
    from tokenizers import decoders, models, normalizers, pre_tokenizers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX
    vocab, merges = make_checkpoint_module().synthetic_bpe(900, seed=7)
    tok = Backend(models.BPE(vocab, merges))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(QWEN_SPECIALS)
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "add_prefix_space": False, "additional_special_tokens": QWEN_SPECIALS[1:], "bos_token": None,
        "chat_template": QWEN_TEMPLATE, "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
        "errors": "replace", "model_max_length": 131072, "pad_token": "<|endoftext|>",
        "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}))
    return d


@pytest.fixture(scope="module", params=["make_checkpoint", "llama3_like", "named_templates", "qwen2_like"])
def pair(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    if request.param == "make_checkpoint":
        make_checkpoint_module().build_tokenizer(d, vocab_size=400, seed=3)
    elif request.param == "qwen2_like":
        _qwen2_like(d)
    else:
        _llama3_like(d)
    if request.param == "named_templates":            # a list of named templates; the default is used
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        cfg["chat_template"] = [{"name": "default", "template": LLAMA3_TEMPLATE},
                                {"name": "rag", "template": "{{ messages[0]['content'] }}"}]
        (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    ours = load_tokenizer(d)
    assert isinstance(ours, Tokenizer)
    return ours, transformers.AutoTokenizer.from_pretrained(str(d))


def test_encode_decode_and_special_tokens_equal_transformers(pair):
    ours, hf = pair
    for text in TEXTS:
        for add in (True, False):
            assert ours(text, add_special_tokens=add).input_ids == hf(text, add_special_tokens=add).input_ids, text
            assert ours.encode(text, add_special_tokens=add) == hf.encode(text, add_special_tokens=add)
        ids = ours(text).input_ids
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
        assert ours.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids)
    assert ours.decode(ids[0]) == hf.decode(ids[0])
    assert (len(ours), ours.vocab_size) == (len(hf), hf.vocab_size)
    assert ours.special_tokens_map == hf.special_tokens_map
    assert ours.all_special_ids == hf.all_special_ids and ours.all_special_tokens == hf.all_special_tokens
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        assert getattr(ours, name) == getattr(hf, name), name
        assert getattr(ours, name + "_id") == getattr(hf, name + "_id"), name
    assert ours.get_vocab() == hf.get_vocab()
    assert ours.convert_tokens_to_ids(["<|end_of_text|>", "nope-not-a-token"]) == \
        hf.convert_tokens_to_ids(["<|end_of_text|>", "nope-not-a-token"])


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_equals_transformers(pair, add_generation_prompt):
    ours, hf = pair
    for msgs in CONVERSATIONS:
        kw = dict(add_generation_prompt=add_generation_prompt)
        text = ours.apply_chat_template(msgs, tokenize=False, **kw)
        assert text == hf.apply_chat_template(msgs, tokenize=False, **kw)
        ids = ours.apply_chat_template(msgs, tokenize=True, **kw)
        assert ids == list(hf.apply_chat_template(msgs, tokenize=True, **kw)["input_ids"])
        assert ours.apply_chat_template(msgs, return_dict=True, **kw).input_ids == ids
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"x": "\u00e9<b>"}}}]
    assert ours.apply_chat_template(CONVERSATIONS[0], tools=tools, tokenize=False) == \
        hf.apply_chat_template(CONVERSATIONS[0], tools=tools, tokenize=False)


def test_template_errors_are_transformers_errors(pair):
    ours, hf = pair
    saved = ours.chat_template
    ours.chat_template = hf.chat_template = "{{ raise_exception('roles must alternate') }}"
    try:
        for tok in (ours, hf):
            with pytest.raises(jinja2.exceptions.TemplateError, match="roles must alternate"):
                tok.apply_chat_template(CONVERSATIONS[0], tokenize=False)
        for tok in (ours, hf):                           # the sandbox refuses Python internals
            with pytest.raises(jinja2.exceptions.SecurityError):
                tok.apply_chat_template(CONVERSATIONS[0], tokenize=False,
                                        chat_template="{{ messages.__class__.__mro__ }}")
    finally:
        ours.chat_template = saved
    with pytest.raises(ValueError, match="empty"):
        ours.apply_chat_template([])


def test_incremental_decode_through_the_detokenizer_equals_transformers(pair):
    ours, hf = pair
    rng = random.Random(1)
    chars = list("abcdefgh ijk.,!\n") + ["\u00e9", "\u00df", "\u4e2d", "\u6587", "\U0001f642", "\u2192"]
    t_ours, t_hf = token_bytes(ours, len(ours)), token_bytes(hf, len(hf))
    # clean_up_tokenization_spaces true (Llama 3's files): transformers 5 ignores it for BPE;
    # graphrt's tokenizer reports it off, so the byte table applies where transformers' has none
    assert t_ours is not None and t_hf in (None, t_ours) and ours.clean_up_tokenization_spaces is False
    for trial in range(20):
        ids = ours("".join(rng.choice(chars) for _ in range(rng.randint(1, 50)))).input_ids
        texts = []
        for tok, table in ((ours, None), (hf, None), (ours, t_ours)):
            st = TextState(tok, ("zz",), decode=make_decoder(tok), table=table)
            for pos in range(0, len(ids), 3):
                if st.add_tokens(ids[pos:pos + 3]) is not None:
                    break
            else:
                st.flush()
            texts.append(st.text)
        assert texts[0] == texts[1] == texts[2], (trial, ids)


def test_chat_template_jinja_file_wins(tmp_path):
    make_checkpoint_module().build_tokenizer(tmp_path, vocab_size=400, seed=3)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "from the config"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert (tmp_path / "chat_template.jinja").is_file()
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert load_tokenizer(tmp_path).chat_template == hf.chat_template != "from the config"
    (tmp_path / "chat_template.jinja").unlink()
    assert load_tokenizer(tmp_path).chat_template == "from the config"


def test_without_tokenizer_json_falls_back_to_transformers_loudly(tmp_path, caplog):
    from tokenizers import ByteLevelBPETokenizer
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["hello world, the graph token"] * 20, vocab_size=300, show_progress=False)
    bpe.save_model(str(tmp_path))                      # vocab.json + merges.txt only
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GPT2Tokenizer"}))
    with caplog.at_level(logging.WARNING, logger="graphrt.checkpoint.tokenizer"):
        tok = load_tokenizer(tmp_path)
    assert not isinstance(tok, Tokenizer) and "no tokenizer.json" in caplog.text
    assert tok.decode(tok("hello world").input_ids) == "hello world"


def _longest_pause(fn) -> tuple[float, float]:
    """fn() while another Python thread wakes every millisecond -> (fn's seconds, the longest
    time that thread waited between two wakes: the GIL held for that long)."""
    import threading
    import time
    gaps, done = [0.0], threading.Event()

    def tick():
        last = time.perf_counter()
        while not done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
    t = threading.Thread(target=tick)
    t.start()
    time.sleep(0.02)
    t0 = time.perf_counter()
    try:
        fn()
    finally:
        elapsed = time.perf_counter() - t0
        done.set()
        t.join()
    return elapsed, max(gaps)


def test_a_megabyte_text_leaves_other_threads_running(tmp_path):
    """encode / decode of a ~2 MB text: the Rust work runs without the GIL (`tokenizers`' single
    encode held it for the whole call, so a server's event loop stalled for seconds)."""
    make_checkpoint_module().build_tokenizer(tmp_path, vocab_size=400, seed=3)
    tok = load_tokenizer(tmp_path)
    text = "".join(random.Random(0).choice(TEXTS) + " " for _ in range(40_000))[:2_000_000]
    ids = []
    elapsed, pause = _longest_pause(lambda: ids.extend(tok.encode(text)))
    assert len(ids) > 100_000
    assert pause < max(0.3 * elapsed, 0.05), f"encode: another thread waited {pause:.2f} s of {elapsed:.2f} s"
    elapsed, pause = _longest_pause(lambda: tok.decode(ids))
    assert pause < max(0.3 * elapsed, 0.05), f"decode: another thread waited {pause:.2f} s of {elapsed:.2f} s"



def test_a_4mb_encoding_is_freed_without_stalling_other_threads(tmp_path):
    """What encode returns is freed with the GIL held: a full Encoding of a 4 MB text (its tokens'
    strings and offsets) took 0.3 s to free, every other thread waiting; encode_batch_fast's
    keeps no offsets (the same ids)."""
    make_checkpoint_module().build_tokenizer(tmp_path, vocab_size=400, seed=3)
    tok = load_tokenizer(tmp_path)
    text = "Hello there, general graph runtime. " * (4_000_000 // 36)
    ids = tok.encode(text)
    assert ids == tok.backend_tokenizer.encode_batch([text])[0].ids
    pauses = [_longest_pause(lambda: tok.encode(text))[1] for _ in range(2)]
    assert min(pauses) < 0.12, pauses