"""A server whose decode blocks carry prompt chunks (mixed_prefill_tokens) over HTTP (the `openai`
client): a long prompt arriving while a stream decodes gets the same text as alone, the running
stream too, and /metrics counts the chunks and tokens the blocks carried."""
from __future__ import annotations

import threading

import pytest

from _checkpoints import write
from _serve_live import LiveServer, get_metrics, pages_full, wait_for

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("transformers")

from graphrt import LLM  # noqa: E402
from graphrt.serve import ServeConfig, create_app  # noqa: E402

PS = 4
LONG = list(range(40, 70))                           # 30 tokens: pieces of 8, then the last 6 + 1
RUN = dict(model="tiny", max_tokens=40, temperature=0.0, extra_body={"ignore_eos": True})
OPTS = dict(model="tiny", max_tokens=4, temperature=0.0, extra_body={"ignore_eos": True})


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    path = write(tmp_path_factory, "serve-mixed", arch="llama", dtype="float32", seed=5)
    llm = LLM(path, device="cpu", backend="reference", max_batch=2, steps_per_graph=2, max_model_len=96,
              page_size=PS, mixed_prefill_tokens=8, max_num_batched_tokens=8, enable_prefix_caching=False)
    with LiveServer(create_app(llm, ServeConfig(served_model_name="tiny", max_waiting=4))) as srv:
        srv.llm = llm
        yield srv


def test_a_long_prompt_rides_the_decode_blocks_over_http(live):
    client = live.client()
    alone_run = client.completions.create(prompt=[5, 6, 7], **RUN).choices[0].text
    alone_long = client.completions.create(prompt=LONG, **OPTS).choices[0].text
    assert get_metrics(live)["graphrt_prefill_mixed_chunks_total"] == 0   # alone: nothing decoded beside it
    got = {}

    def run():
        got["run"] = "".join(c.choices[0].text for c in client.completions.create(prompt=[5, 6, 7], stream=True,
                                                                                  **RUN))
    t = threading.Thread(target=run)
    t.start()
    assert wait_for(lambda: live.llm.engine.scheduler.decode_rows())   # the stream decodes
    got["long"] = client.completions.create(prompt=LONG, **OPTS).choices[0].text
    t.join(60)
    assert got == {"run": alone_run, "long": alone_long}
    m = get_metrics(live)
    assert m["graphrt_prefill_mixed_chunks_total"] >= 2 and m["graphrt_prefill_mixed_tokens_total"] >= 16
    assert wait_for(lambda: pages_full(live.llm))
