"""Structured outputs with a real tokenizer and a real model on CPU: SmolLM2-135M-Instruct's GGUF
(tests/_real_model.py; 49,152 byte-level BPE tokens, where the tiny tests' tokenizer has 384).

- 200 random JSON schemas (tests/_schemas.py) compiled against the real vocabulary and walked
  token by token from random logits through the device mask's rule (GrammarState.fill ->
  TokenMask.write -> the kernel's torch reference): every completed output validates
  (jsonschema, an independent validator), so the token byte table, the compiled masks and the
  end-of-sequence rule hold on a real vocabulary;
- the model itself, greedy through `LLM.generate` with schemas, regexes and a choice: every
  output that ends by the grammar validates, and most do end within the token budget."""
from __future__ import annotations

import json
import random
import re

import pytest
import torch

from _real_model import smollm2_gguf  # noqa: F401 (a fixture)
from _schemas import random_object
from graphrt import LLM, SamplingParams
from graphrt.engine.params import StructuredOutputsParams
from graphrt.engine.structured import Grammars
from graphrt.engine.token_bytes import token_bytes
from graphrt.kernels.token_mask import reference_mask
from graphrt.model.token_mask import TokenMask

jsonschema = pytest.importorskip("jsonschema")
pytestmark = [pytest.mark.real_model, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def llm(smollm2_gguf):
    llm = LLM(str(smollm2_gguf), device="cpu", max_batch=4, max_model_len=384)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def grammars(llm):
    vocab = llm.engine.vocab_size
    table = token_bytes(llm.tokenizer, vocab)
    assert table is not None
    eos = sorted(llm.engine.scheduler.eos)
    return Grammars(llm.tokenizer, table, vocab=vocab, eos_ids=eos), table, vocab, eos


def _walk(grammars, so, seed: int, max_steps: int = 200):
    """Tokens drawn from random logits under the grammar's masks -> (text, completed)."""
    g, table, vocab, eos = grammars
    state = g.state(g.compile(so), so.kind)
    mask = TokenMask.allocate(1, vocab, "cpu")
    gen = torch.Generator().manual_seed(seed)
    toks = []
    for _ in range(max_steps):
        bits = torch.empty((1, mask.words), dtype=torch.int32)
        state.fill(bits, 0)
        mask.write([0], bits, torch.ones(1, dtype=torch.int32))
        logits = torch.randn(1, vocab, generator=gen)
        logits[:, eos] += 3.0                   # end soon once the grammar allows it: bounded walks
        logits = reference_mask(logits, mask.bits[:, 0], mask.active[:, 0], torch.tensor([0]))
        tok = int(torch.argmax(logits[0]))
        assert logits[0, tok] > float("-inf")
        state.advance([tok])
        if tok in eos:
            return b"".join(table[t] for t in toks).decode("utf-8", "surrogatepass"), True
        toks.append(tok)
    return b"".join(table[t] for t in toks).decode("utf-8", "replace"), False


def test_200_schemas_validate_on_the_real_vocabulary(grammars):
    rng = random.Random(1)
    done = refused = 0
    for i in range(215):
        schema = random_object(rng)
        so = StructuredOutputsParams(json=schema)
        try:
            grammars[0].compile(so)
        except ValueError as e:                 # an unsupported feature: one line, naming the field
            assert str(e).startswith("structured_outputs.json: ") and "\n" not in str(e)
            refused += 1
            continue
        text, complete = _walk(grammars, so, seed=i)
        if complete:
            jsonschema.validate(json.loads(text), schema)
            done += 1
    assert refused <= 10 and done >= 200, (done, refused)


def test_regex_and_choice_on_the_real_vocabulary(grammars):
    for pattern in (r"\d{3}-[a-z]{2,4}", r"(yes|no)!?", r"[A-Z][a-z]{1,6} \d{1,4}", r"0x[0-9a-f]{1,8}"):
        for seed in range(3):
            text, complete = _walk(grammars, StructuredOutputsParams(regex=pattern), seed)
            assert complete and re.fullmatch(pattern, text), (pattern, text)
    choices = ["Paris", "Lyon", "São Paulo", "{\"x\": 1}"]
    for seed in range(6):
        text, complete = _walk(grammars, StructuredOutputsParams(choice=choices), seed)
        assert complete and text in choices, text


SCHEMAS = [
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                      "country": {"type": "string", "maxLength": 20}},
     "required": ["city", "country"], "additionalProperties": False},
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 130}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]},
                                                 "minItems": 1, "maxItems": 3}},
     "required": ["colors"], "additionalProperties": False},
    {"type": "object", "properties": {"answer": {"type": "boolean"}, "why": {"type": "string", "maxLength": 24}},
     "required": ["answer"], "additionalProperties": False},
]
QUESTIONS = ["Where is the Eiffel Tower? Answer as JSON.", "Invent a person. Answer as JSON.",
             "Name some primary colors as JSON.", "Is the sky blue? Answer as JSON."]


def test_the_model_generates_valid_constrained_output(llm):
    prompts = [llm.tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
               for q in QUESTIONS]
    params = [SamplingParams(max_tokens=64, temperature=0.0, structured_outputs={"json": s}) for s in SCHEMAS]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    ended = 0
    for o, s in zip(outs, SCHEMAS):
        c = o.outputs[0]
        if c.finish_reason == "stop":
            jsonschema.validate(json.loads(c.text), s)
            ended += 1
    assert ended >= 3, [(o.outputs[0].finish_reason, o.outputs[0].text) for o in outs]
    regex, choice = r"[A-Z][a-z]{1,9}", ["Paris", "London", "Berlin"]   # bounded: it must end
    prompt = llm.tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                               add_generation_prompt=True)
    outs = llm.generate([{"prompt_token_ids": prompt}] * 2,
                        [SamplingParams(max_tokens=16, temperature=0.0, structured_outputs={"regex": regex}),
                         SamplingParams(max_tokens=16, temperature=0.0, structured_outputs={"choice": choice})],
                        use_tqdm=False)
    assert re.fullmatch(regex, outs[0].outputs[0].text) and outs[0].outputs[0].finish_reason == "stop"
    assert outs[1].outputs[0].text in choice and outs[1].outputs[0].finish_reason == "stop"


def test_the_model_decodes_its_json_unmasked(llm):
    """Asked for JSON, the model writes what its grammar allows, so its row decodes unmasked
    (engine/structured.py FreeRun): whole K-step blocks ran while it decoded, fewer split steps
    than the always-masked engine's, and the tokens are the same."""
    eng = llm.engine
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
              "city": {"type": "string"}}, "required": ["name", "age", "city"], "additionalProperties": False}
    msg = [{"role": "user", "content": "Give a JSON object with the name, age and city of a person. "
                                       "Reply with JSON only."}]
    runs = {}
    for free in (True, False):
        eng.FREE_RUN = free
        parts = []
        inner = eng.runtime.run
        eng.runtime.run = lambda b: parts.append(b.part) or inner(b)
        try:
            out = llm.chat([msg], SamplingParams(max_tokens=80, temperature=0, structured_outputs={"json": schema}),
                           use_tqdm=False)[0].outputs[0]
        finally:
            eng.runtime.run = inner
            eng.FREE_RUN = True
        runs[free] = (out.token_ids, parts, out.text)
    (got, parts, text), (want, parts0, _) = runs[True], runs[False]
    assert got == want
    jsonschema.validate(json.loads(text), schema)
    assert parts.count(None) >= 2 and parts0.count(None) == 0
    assert parts.count("draw") < parts0.count("draw") // 2
