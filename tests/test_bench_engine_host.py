"""tools/bench_engine_host.py on CPU: its stub executor answers every call the engine makes (plain,
n-gram and draft-shaped speculation), every request's tokens come back in order, and the table's
JSON has one row per configuration (no timing is checked: speed is the tool's to show)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

import bench_engine_host as beh  # noqa: E402

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return beh._tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.mark.parametrize("method", [None, "ngram", "draft"])
def test_stub_engine_streams_the_canned_tokens_and_frees_every_page(tok, method):
    from graphrt import LLM
    tokenizer, ids = tok
    eng = beh._engine(method, 4, tokenizer, ids, context=512)
    llm = LLM.__new__(LLM)
    llm.engine, llm.tokenizer, llm._workers = eng, tokenizer, None
    outs = llm.generate([beh._prompt(i, 40, len(tokenizer)) for i in range(3)], beh._params(True, 37),
                        use_tqdm=False)
    assert [len(o.token_ids) for o in outs] == [37, 37, 37]
    assert all(o.finish_reason == "length" for o in outs)
    assert outs[0].token_ids[0] == ids[0]                    # the stub's first draw
    alloc = eng.scheduler.allocator
    assert alloc.num_free == alloc.num_pages and not eng._pending
    if method is not None:
        st = eng.stats()
        assert st["spec_blocks"] > 0 and st["spec_tokens_per_round"] > 1


def test_table_json(tmp_path):
    out = tmp_path / "host.json"
    beh.main(["--methods", "none,ngram", "--batches", "1,2", "--texts", "plain,stop", "--blocks", "3",
              "--calls", "1", "--repeat", "1", "--gen", "9", "--prompt-len", "20", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["method"], r["batch"], r["text"]) for r in rows] == [
        (m, b, t) for m in ("none", "ngram") for b in (1, 2) for t in ("plain", "stop")]
    assert all(r["block_us"] > 0 and r["call_us"] > 0 and r["first_us"] > 0 for r in rows)
