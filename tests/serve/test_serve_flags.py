"""`graphrt serve MODEL` and the vLLM-named flags (graphrt/serve/flags.py): each reaches the
engine or the server, each is also a --config key and the flag wins; bad values and a device the
host cannot run are one line and exit 2 before the model loads; --api-key makes every endpoint
but /health answer 401 (an OpenAI error body) without `Authorization: Bearer <key>`, checked with
the `openai` client against a live server on 127.0.0.1."""
from __future__ import annotations

import http.client
import json
import socket
import sys
import time

import pytest
import torch

from _checkpoints import write
from _serve_live import LiveServer

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from graphrt.serve import ServeConfig, create_app  # noqa: E402
from graphrt.serve import cli as serve_cli  # noqa: E402
from graphrt.serve.flags import API_KEY_ENV  # noqa: E402

TEMPLATE = "SYS:{% for m in messages %}{{ m['content'] }}|{% endfor %}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _args(argv):
    return serve_cli.build_parser().parse_args(argv)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write(tmp_path_factory, "flags", arch="llama", dtype="float32", seed=4)


def _exit_2(argv, capsys, monkeypatch) -> str:
    """main(argv) must stop with one line on stderr and exit 2 without loading the model."""
    calls = []
    monkeypatch.setattr(serve_cli, "load", lambda args, **kw: calls.append(args))
    t0 = time.perf_counter()
    with pytest.raises(SystemExit) as e:
        serve_cli.main(argv + ["--port", str(_free_port())])
    lines = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(lines) == 1 and calls == [], lines
    assert time.perf_counter() - t0 < 5
    return lines[0]


def test_model_positional_or_flag():
    assert _args(["/m"]).model_arg == "/m" and _args(["--model", "/m"]).model == "/m"
    from graphrt.serve.flags import model_path
    assert model_path(_args(["/m"])) == model_path(_args(["--model", "/m"])) == model_path(_args(["/m", "--model", "/m"]))


@pytest.mark.parametrize("argv,text", [
    ([], "MODEL: the checkpoint is required (graphrt serve DIR|ORG/NAME, or --model)"),
    (["/a", "--model", "/b"], "MODEL: given twice, '/a' and --model '/b'; give one"),
    (["/a", "--max-model-len", "0"], "max_model_len: must be an int in [1, 2147483647], got 0"),
    (["/a", "--max-num-seqs", "-1"], "max_batch: must be an int in [1, 2147483647], got -1"),
    (["/a", "--gpu-memory-utilization", "1.5"], "gpu_memory_utilization: must be a number in (0, 1], got 1.5"),
    (["/a", "--device", "cpu", "--dtype", "bfloat16"], "--dtype bfloat16: on a CPU graphrt runs float32 only"),
    (["/a", "--chat-template", "/no/such/template.jinja"], "--chat-template: no such file '/no/such/template.jinja'"),
    (["/a", "--api-key", ""], "api_key: expected a non-empty string, got an empty one"),
    (["/a", "--max-prefill-stall", "0"], "max_prefill_stall: must be None or a number in (0, 100]"),
    (["/a", "--steps-per-graph", "0"], "steps_per_graph: must be 'auto' or an int in [1, 2147483647]"),
    (["/a", "--steps-per-graph", "-1"], "steps_per_graph: must be 'auto' or an int"),
    (["/a", "--steps-per-graph", "fast"], "steps_per_graph: must be 'auto' or an int"),
    (["/a", "--steps-per-graph", "2.5"], "got '2.5'"),
    (["/a", "--steps-per-graph", "true"], "got 'true'"),
])
def test_bad_values_exit_2_before_loading(capsys, monkeypatch, argv, text):
    assert text in _exit_2(argv, capsys, monkeypatch)


def test_steps_per_graph_flag_and_yaml(tmp_path, capsys, monkeypatch):
    assert serve_cli.resolve_configs(_args(["/m"]))[0].steps_per_graph == "auto"          # the default
    assert serve_cli.resolve_configs(_args(["/m", "--steps-per-graph", "AUTO"]))[0].steps_per_graph == "auto"
    y = tmp_path / "k.yaml"
    y.write_text("steps_per_graph: 1\n")
    assert serve_cli.resolve_configs(_args(["/m", "--config", str(y)]))[0].steps_per_graph == 1
    assert serve_cli.resolve_configs(_args(["/m", "--config", str(y), "--steps-per-graph", "auto"]))[0] \
        .steps_per_graph == "auto"                                                        # the flag wins
    for bad in ("true", "2.5", "fast", "0"):
        y.write_text(f"steps_per_graph: {bad}\n")
        assert _exit_2(["/a", "--config", str(y)], capsys, monkeypatch).startswith(
            "graphrt serve: error: steps_per_graph: must be 'auto' or an int")


def test_dtype_choices_are_argparse_errors(capsys):
    with pytest.raises(SystemExit) as e:
        serve_cli.main(["/a", "--dtype", "fp32"])
    assert e.value.code == 2 and "--dtype: invalid choice: 'fp32'" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without CUDA")
def test_cuda_without_cuda_in_cli_words(capsys, monkeypatch):
    line = _exit_2(["/a", "--device", "cuda"], capsys, monkeypatch)
    assert line.startswith("graphrt serve: error: --device cuda: torch ") and "sees no CUDA device" in line
    assert "device='cpu'" not in line                         # not the Python API's wording


def test_cuda_without_flashinfer_in_cli_words(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    for argv in (["/a", "--device", "cuda"], ["/a"]):          # given, and the default on a CUDA host
        line = _exit_2(argv, capsys, monkeypatch)
        assert line.startswith("graphrt serve: error: --device cuda: graphrt needs FlashInfer on CUDA")
        assert 'pip install "graphrt[gpu]"' in line and "flashinfer-python==0.7.4" in line


def test_flags_win_over_the_yaml_and_reach_the_configs(tmp_path, monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    tmpl = tmp_path / "t.jinja"
    tmpl.write_text(TEMPLATE)
    y = tmp_path / "s.yaml"
    y.write_text(f"max_num_seqs: 3\nmax_model_len: 80\ndtype: float32\ngpu_memory_utilization: 0.5\n"
                 f"api_key: from-yaml\nchat_template: {tmpl}\n")
    eng, srv = serve_cli.resolve_configs(_args(["/m", "--config", str(y)]))
    assert (eng.max_batch, eng.max_model_len, eng.dtype, eng.gpu_memory_utilization) == (3, 80, "float32", 0.5)
    assert srv.api_key == "from-yaml" and srv.chat_template == TEMPLATE and srv.served_model_name == "/m"
    eng, srv = serve_cli.resolve_configs(_args([
        "/m", "--config", str(y), "--max-num-seqs", "5", "--max-model-len", "48", "--dtype", "auto",
        "--gpu-memory-utilization", "0.7", "--api-key", "from-flag", "--chat-template", "{{ 'x' }}"]))
    assert (eng.max_batch, eng.max_model_len, eng.dtype, eng.gpu_memory_utilization) == (5, 48, None, 0.7)
    assert srv.api_key == "from-flag" and srv.chat_template == "{{ 'x' }}"
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert serve_cli.resolve_configs(_args(["/m", "--config", str(y)]))[1].api_key == "from-env"
    assert serve_cli.resolve_configs(_args(["/m", "--api-key", "k"]))[1].api_key == "k"
    assert "from-env" not in repr(serve_cli.resolve_configs(_args(["/m"]))[1])   # a secret: not in logs
    assert serve_cli.resolve_configs(_args(["/m"]))[0].max_prefill_stall == "auto"   # 1.0, or None at K = 1
    assert serve_cli.resolve_configs(_args(["/m", "--max-prefill-stall", "auto"]))[0].max_prefill_stall == "auto"
    assert serve_cli.resolve_configs(_args(["/m", "--max-prefill-stall", "0.5"]))[0].max_prefill_stall == 0.5
    assert serve_cli.resolve_configs(_args(["/m", "--max-prefill-stall", "none"]))[0].max_prefill_stall is None
    with pytest.raises(SystemExit):
        _args(["/m", "--max-prefill-stall", "fast"])
    y.write_text("max_num_seqs: 3\nmax_batch: 4\n")
    with pytest.raises(ValueError, match=r"max_num_seqs \(3\) and max_batch \(4\) disagree"):
        serve_cli.resolve_configs(_args(["/m", "--config", str(y)]))


# ---- a live server from the flags ------------------------------------------------------------
@pytest.fixture(scope="module")
def served(ckpt, tmp_path_factory):
    tmpl = tmp_path_factory.mktemp("tmpl") / "chat.jinja"
    tmpl.write_text(TEMPLATE)
    args = _args([str(ckpt), "--device", "cpu", "--max-model-len", "64", "--max-num-seqs", "2",
                  "--dtype", "float32", "--api-key", "sesame", "--chat-template", str(tmpl),
                  "--served-model-name", "tiny"])
    llm, serve_cfg = serve_cli.load(args)
    with LiveServer(create_app(llm, serve_cfg)) as srv:
        yield llm, srv


def _client(srv, key):
    return openai.OpenAI(base_url=srv.base_url + "/v1", api_key=key, max_retries=0, timeout=120)


def _raw(srv, method, path, headers=None, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    conn.request(method, path, body=None if body is None else json.dumps(body),
                 headers={"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    return r.status, dict(r.getheaders()), r.read().decode()


def test_flags_reach_the_engine(served):
    llm, _ = served
    assert llm.engine.max_model_len == 64 and llm.config.max_batch == 2
    assert llm.runtime.caps.config.dtype == "float32"


def test_api_key_opens_every_endpoint(served):
    llm, srv = served
    c = _client(srv, "sesame")
    assert [m.id for m in c.models.list().data] == ["tiny"]
    r = c.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=3, temperature=0.0,
                             extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3
    # the chat template given by --chat-template renders the prompt (its text, tokenized plainly)
    msgs = [{"role": "user", "content": "Hi"}, {"role": "user", "content": "there"}]
    r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=2, temperature=0.0)
    want = llm.tokenizer("SYS:Hi|there|", add_special_tokens=False).input_ids
    assert r.usage.prompt_tokens == len(want)
    status, _, _ = _raw(srv, "GET", "/metrics", {"Authorization": "Bearer sesame"})
    assert status == 200
    status, _, _ = _raw(srv, "GET", "/v1/models", {"Authorization": "bearer sesame"})   # scheme: any case
    assert status == 200


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "sesame"},
                                     {"Authorization": "Basic sesame"}, {"Authorization": "Bearer sesame2"}])
@pytest.mark.parametrize("method,path", [("GET", "/v1/models"), ("GET", "/metrics"), ("GET", "/v1/models/tiny"),
                                         ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                                         ("GET", "/no/such/route")])
def test_without_the_key_everything_but_health_is_401(served, headers, method, path):
    _, srv = served
    body = {"model": "tiny", "prompt": "x", "max_tokens": 1} if method == "POST" else None
    status, resp_headers, text = _raw(srv, method, path, headers, body)
    assert status == 401, text
    err = json.loads(text)["error"]
    assert err["code"] == 401 and err["type"] == "invalid_request_error" and err["param"] == "authorization"
    assert "Authorization: Bearer" in err["message"] and "sesame" not in text
    assert resp_headers.get("www-authenticate") == "Bearer"


def test_health_needs_no_key_and_the_client_sees_401(served):
    _, srv = served
    assert _raw(srv, "GET", "/health")[0] == 200
    with pytest.raises(openai.AuthenticationError) as e:
        _client(srv, "wrong").models.list()
    assert e.value.status_code == 401


def test_no_api_key_no_authentication(ckpt):
    from graphrt import LLM
    llm = LLM(ckpt, device="cpu", max_batch=1, steps_per_graph=1, max_model_len=32)
    with LiveServer(create_app(llm, ServeConfig(served_model_name="m"))) as srv:
        assert _raw(srv, "GET", "/v1/models")[0] == 200


def test_serve_config_imports_without_the_server_packages():
    """graphrt-capture --model builds serve's config without fastapi / starlette installed (the
    body-limit middleware imports starlette only when it refuses a body)."""
    import subprocess
    code = ("import sys, importlib.abc\n"
            "class Block(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name.split('.')[0] in ('fastapi', 'starlette', 'uvicorn'):\n"
            "            raise ImportError('blocked ' + name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "import graphrt.serve.config, graphrt.serve.limits, graphrt.serve.flags\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
