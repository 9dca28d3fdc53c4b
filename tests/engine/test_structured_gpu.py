"""Constrained decoding on the GPU with captured graphs (split steps: a forward graph and a
processed draw graph per bucket, the mask kernel inside the draw): a JSON-schema / regex /
choice request beside a free greedy one; every constrained output validates, the free one equals
its output alone (up to a bf16 near-tie); the mask kernel on CUDA equals its torch rule."""
from __future__ import annotations

import json
import re

import pytest
import torch

from _checkpoints import write
from graphrt import LLM, SamplingParams
from graphrt.attention.graphs import GraphKey
from graphrt.kernels.token_mask import apply_token_mask, reference_mask, words

pytestmark = pytest.mark.gpu
jsonschema = pytest.importorskip("jsonschema")
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "tags": {"type": "array", "items": {
    "enum": ["a", "b"]}, "minItems": 1, "maxItems": 3}}, "required": ["ok", "tags"], "additionalProperties": False}


def test_mask_kernel_cuda():
    g = torch.Generator(device="cuda").manual_seed(1)
    v = 128256
    bits = torch.randint(-2**31, 2**31 - 1, (8, words(v)), device="cuda", generator=g, dtype=torch.int64).to(torch.int32)
    active = torch.tensor([1, 0, 1, 1, 0, 1, 0, 1], dtype=torch.int32, device="cuda")
    logits = torch.randn(8, v, device="cuda", generator=g).to(torch.bfloat16)
    assert torch.equal(apply_token_mask(logits.clone(), bits, active), reference_mask(logits, bits, active))


def test_constrained_beside_free_graphs(tmp_path_factory):
    path = write(tmp_path_factory, "so_gpu", arch="llama", dtype="bfloat16", seed=11)
    llm = LLM(path, max_batch=8, steps_per_graph=4, max_model_len=256)
    keys = llm.runtime.runtime.graphs.keys()
    for b in llm.runtime.runtime.config.buckets:               # the split step's graphs, captured
        assert GraphKey("decode_forward", b) in keys
        assert GraphKey("decode_draw", b, sampled=True, processed=True) in keys
    free = SamplingParams(max_tokens=24, temperature=0, logprobs=2)
    params = [free, SamplingParams(max_tokens=60, temperature=0.8, seed=1, structured_outputs={"json": SCHEMA}),
              SamplingParams(max_tokens=16, temperature=0, structured_outputs={"regex": r"[a-c]{2}-\d{2}"}),
              SamplingParams(max_tokens=8, temperature=0, structured_outputs={"choice": ["yes", "no"]})]
    outs = llm.generate(["say something"] * 4, params, use_tqdm=False)
    if outs[1].outputs[0].finish_reason == "stop":
        jsonschema.validate(json.loads(outs[1].outputs[0].text), SCHEMA)
    assert re.fullmatch(r"[a-c]{2}-\d{2}", outs[2].outputs[0].text)
    assert outs[3].outputs[0].text in ("yes", "no")
    alone = llm.generate(["say something"], [free], use_tqdm=False)[0].outputs[0]
    got = outs[0].outputs[0].token_ids
    # bf16 on a GPU: the batch's bucket (4 rows, then fewer as constrained rows finish) picks other
    # GEMM kernels than 1 row alone, so the free row may part from its lone run only where the lone
    # run's top two log-probs are within bf16 rounding of each other (a near-tie), never at a margin
    i = next((j for j, (a, b) in enumerate(zip(got, alone.token_ids)) if a != b), None)
    if i is not None:
        top2 = sorted(alone.logprobs[i].values(), key=lambda lp: -lp.logprob)[:2]
        margin = top2[0].logprob - top2[1].logprob
        assert margin < 0.25, f"the free row parts from its lone run at token {i} at a margin {margin:.3f}"
    else:
        assert got == alone.token_ids


def _first_part(a: list, b: list) -> int | None:
    """The first index where token lists a and b differ (None: equal)."""
    i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return i if i is not None or len(a) == len(b) else min(len(a), len(b))


def test_unmasked_runs_on_the_graphs(tmp_path_factory):
    """Unmasked runs (engine/structured.py FreeRun) with captured graphs: the split draw graph
    reports each row's argmax before its mask; a row whose model follows its grammar moves to
    K-step blocks (launches with part None), and one whose token is refused is set back. Greedy
    rows give the always-masked engine's tokens (a divergence only at a masked near-tie, read
    from the masked run's log-probs)."""
    path = write(tmp_path_factory, "so_free_gpu", arch="llama", dtype="bfloat16", seed=12)
    llm = LLM(path, max_batch=4, steps_per_graph=4, max_model_len=256)
    eng = llm.engine
    # "json": a prompt whose greedy text on this checkpoint is printable ASCII (most prompts of a
    # random model give partial UTF-8 bytes, which no grammar of text admits)
    own = llm.generate(["json"], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True),
                       use_tqdm=False)[0].outputs[0].text
    forced = own[:len(own) // 2] + "zz"

    def run(flag, so, logprobs=None):
        eng.FREE_RUN = flag
        ps = [SamplingParams(max_tokens=30, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=40, temperature=0, structured_outputs=so, logprobs=logprobs)]
        kinds, inner = [], eng.runtime.run
        eng.runtime.run = lambda b: kinds.append(b.part) or inner(b)
        try:
            outs = llm.generate(["hello", "json"], ps, use_tqdm=False)
        finally:
            eng.runtime.run = inner
            eng.FREE_RUN = True
        return outs[1].outputs[0], kinds

    for so in ({"choice": [forced, "other"]}, {"regex": r"[ -~]{5,60}"}):
        got, kinds = run(True, so)
        want, kinds0 = run(False, so)
        if "regex" in so:
            assert re.fullmatch(r"[ -~]{5,60}", got.text), got.text
        else:
            assert got.text in (forced, "other"), got.text
        i = _first_part(got.token_ids, want.token_ids)
        if i is not None:
            masked = run(False, so, logprobs=2)[0]
            top2 = sorted(masked.logprobs[i].values(), key=lambda lp: -lp.logprob)[:2]
            assert len(top2) == 2 and top2[0].logprob - top2[1].logprob < 0.25, (so, i, got.token_ids, want.token_ids)
        if "regex" in so:                                  # printable text: the model's words fit it
            assert kinds.count(None) > kinds0.count(None), (kinds, kinds0)


def test_unmasked_runs_under_ngram_speculation_on_the_graphs(tmp_path_factory):
    """n-gram speculation with captured graphs: the one-round grammar blocks' graphs report each
    verified position's argmax before the masks (SpecBuffers.argmax), so a row whose model
    follows its grammar moves to whole R-round blocks (launches with k > 0 and rounds None while
    it decodes); its greedy tokens are the always-masked engine's (grammar rounds only; a
    divergence only at a masked near-tie, read from that run's log-probs)."""
    path = write(tmp_path_factory, "so_free_spec_gpu", arch="llama", dtype="bfloat16", seed=12)
    llm = LLM(path, max_batch=4, steps_per_graph=4, max_model_len=256, num_pages=64,
              speculative={"method": "ngram", "num_tokens": 3})
    eng = llm.engine
    assert eng.caps.spec_grammar
    eng.policy = None                                  # every block speculates: grammar rounds while masked
    so = {"regex": r"[ -~]{5,60}"}

    def run(flag, logprobs=None):
        eng.FREE_RUN = flag
        ps = [SamplingParams(max_tokens=30, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=40, temperature=0, structured_outputs=so, logprobs=logprobs)]
        kinds, inner = [], eng.runtime.run
        eng.runtime.run = lambda b: kinds.append((b.k, b.rounds, len(eng.scheduler.constrained))) or inner(b)
        try:
            out = llm.generate(["hello", "json"], ps, use_tqdm=False)[1].outputs[0]
        finally:
            eng.runtime.run = inner
            eng.FREE_RUN = True
        assert re.fullmatch(r"[ -~]{5,60}", out.text), out.text
        return out, sum(1 for k, rounds, con in kinds if k and rounds is None and con)

    got, whole = run(True)
    want, whole0 = run(False)
    assert whole0 == 0 and whole > 0, (whole, whole0)
    i = _first_part(got.token_ids, want.token_ids)
    if i is not None:
        masked = run(False, logprobs=2)[0]
        top2 = sorted(masked.logprobs[i].values(), key=lambda x: -x.logprob)[:2]
        assert len(top2) == 2 and top2[0].logprob - top2[1].logprob < 0.25, (i, got.token_ids, want.token_ids)
