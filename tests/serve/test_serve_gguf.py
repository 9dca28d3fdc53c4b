"""`graphrt serve model.gguf`: the serve command's load path (graphrt/serve/cli.py `load`) takes a
GGUF file (graphrt/checkpoint/gguf_file.py), the model name defaults to the path as given, and a
chat completion through the OpenAI client answers with the tokens LLM(model.gguf) generates."""
from __future__ import annotations

import pytest

from _checkpoints import write
from _gguf_files import write_gguf

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")

from _serve_live import LiveServer  # noqa: E402
from graphrt import SamplingParams  # noqa: E402
from graphrt.serve import create_app  # noqa: E402
from graphrt.serve.cli import build_parser, load  # noqa: E402


def test_serve_loads_a_gguf_file_and_answers(tmp_path_factory):
    src = write(tmp_path_factory, "serve_gguf_src", arch="qwen3", dtype="float32", seed=5)
    gguf = write_gguf(src, tmp_path_factory.mktemp("serve_gguf") / "tiny-qwen3.Q8_0.gguf", qtype="Q8_0")
    args = build_parser().parse_args([str(gguf), "--device", "cpu", "--max-num-seqs", "2", "--max-model-len", "64",
                                      "--steps-per-graph", "2"])
    llm, cfg = load(args)
    try:
        assert cfg.served_model_name == str(gguf) and llm.checkpoint.path.name == gguf.name
        msgs = [{"role": "user", "content": "Hello world"}]
        want = llm.chat(msgs, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        with LiveServer(create_app(llm, cfg)) as srv:
            r = srv.client().chat.completions.create(model=str(gguf), messages=msgs, max_tokens=4, temperature=0.0,
                                                     extra_body={"ignore_eos": True, "return_token_ids": True})
        assert r.choices[0].message.content == want.text
    finally:
        llm.shutdown()
