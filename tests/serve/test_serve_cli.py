"""`graphrt serve` command line (graphrt/serve/cli.py, config.py, graphrt/cli.py): help texts and
defaults, --version, unknown commands, the port checked before the model loads, the real server
started with no TRITON_INTERPRET (stream deltas without "role": null, the stats and refusal log
lines, graphrt/serve/stats_log.py), and the serving benchmark's CPU smoke run (tools/bench_serve.py
starts the real CLI in a subprocess)."""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from _checkpoints import tool_module, write

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from graphrt import cli as graphrt_cli  # noqa: E402
from graphrt.serve import ServeConfig  # noqa: E402
from graphrt.serve.cli import main as serve_main  # noqa: E402
from graphrt.serve.config import load_serve_yaml  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_config_validates():
    with pytest.raises(ValueError, match="^max_waiting: must be an int >= 0, got -1"):
        ServeConfig(max_waiting=-1)
    with pytest.raises(ValueError, match="^served_model_name"):
        ServeConfig(served_model_name="")


def test_yaml_splits_engine_and_server_keys_and_names_unknown_ones(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("max_batch: 4\nbackend: torch-splitkv\nmax_waiting: 3\nserved_model_name: m\n")
    eng, srv = load_serve_yaml(f, ("max_batch", "backend"))
    assert eng == {"max_batch": 4, "backend": "torch-splitkv"} and srv == {"max_waiting": 3, "served_model_name": "m"}
    f.write_text("max_batch: 4\nmax_batchh: 5\n")
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['max_batchh'\]"):
        load_serve_yaml(f, ("max_batch",))
    f.write_text("- 1\n")
    with pytest.raises(ValueError, match="expected a mapping"):
        load_serve_yaml(f, ("max_batch",))
    with pytest.raises(ValueError, match="--config: no such file"):
        load_serve_yaml(tmp_path / "nope.yaml", ())


def test_graphrt_command_dispatch(capsys):
    with pytest.raises(SystemExit) as e:
        graphrt_cli.main([])
    assert e.value.code == 2 and "serve" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        graphrt_cli.main(["serve", "--help"])
    assert e.value.code == 0 and "--graph-cache" in capsys.readouterr().out


@pytest.mark.parametrize("argv,text", [
    (["--model", "/nonexistent/ckpt", "--device", "cpu"], "checkpoint: '/nonexistent/ckpt' is not a directory"),
    (["--model", ".", "--device", "cpu", "--port", "0"], "--port: must be in [1, 65535]"),
    (["--model", ".", "--device", "cpu", "--max-waiting", "-2"], "max_waiting: must be an int >= 0"),
    (["--model", ".", "--device", "cpu", "--graph-cache", "/nonexistent/cache"], "no such directory; not a graph cache"),
    (["--model", ".", "--device", "cpu", "--draft-model", "/x"], "--speculative-method: needed with --draft-model"),
    (["--model", ".", "--device", "cpu", "--speculative-method", "ngram", "--num-speculative-tokens", "0"],
     "--num-speculative-tokens: must be an int in [1, 15], got 0"),
    (["--model", ".", "--device", "cpu", "--speculative-method", "draft"], "--draft-model: method 'draft' needs"),
    (["--model", ".", "--device", "cpu", "--mixed-prefill-tokens", "-1"], "mixed_prefill_tokens: must be an int in [0, 2048]"),
    (["--model", ".", "--device", "cpu", "--mixed-prefill-tokens", "4096", "--max-num-batched-tokens", "8192"],
     "mixed_prefill_tokens: must be an int in [0, 2048]"),
    (["--model", ".", "--device", "cpu", "--mixed-prefill-tokens", "512", "--max-num-batched-tokens", "256"],
     "mixed_prefill_tokens: 512 exceeds max_num_batched_tokens=256"),
])
def test_serve_cli_bad_arguments_exit_2_with_one_line(capsys, argv, text):
    if "--port" not in argv:
        argv = argv + ["--port", str(_free_port())]      # not 8000: the machine is shared
    with pytest.raises(SystemExit) as e:
        serve_main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and text in err and len(err.strip().splitlines()) == 1, err


def test_speculative_flags_build_the_engine_config():
    from graphrt.serve.cli import build_parser, resolve_configs
    args = build_parser().parse_args(["--model", "m", "--speculative-method", "draft", "--draft-model", "/d",
                                      "--num-speculative-tokens", "3"])
    eng, _ = resolve_configs(args)
    assert (eng.speculative.method, eng.speculative.draft_model, eng.speculative.num_tokens) == ("draft", "/d", 3)
    eng, _ = resolve_configs(build_parser().parse_args(["--model", "m"]))
    assert eng.speculative is None


def test_every_serve_option_has_help_and_shows_its_default():
    from graphrt.serve.cli import build_parser
    p = build_parser()
    text = p.format_help()
    options = [a for a in p._actions if not isinstance(a, (argparse._HelpAction, argparse._VersionAction))]
    assert {"--model", "--host", "--port", "--log-level", "--device", "--revision"} <= \
        {o for a in options for o in a.option_strings}
    flat = " ".join(text.split())
    for a in options:
        assert a.help and len(a.help) > 10, a.option_strings
        if a.required:
            continue
        if a.default is None:                          # None: the help says what the default is
            assert "default" in a.help, a.option_strings
        else:
            assert f"(default: {a.default})" in flat, a.option_strings
    for shown in ("(default: 127.0.0.1)", "(default: 8000)", "(default: info)", "(default: 1)"):
        assert shown in flat, shown


def test_version_and_unknown_command(capsys):
    import graphrt
    want = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert graphrt.__version__ == want
    for argv in (["--version"], ["serve", "--version"]):
        with pytest.raises(SystemExit) as e:
            graphrt_cli.main(argv)
        assert e.value.code == 0 and capsys.readouterr().out.strip() == f"graphrt {want}"
    with pytest.raises(SystemExit) as e:
        graphrt_cli.main(["srve", "--model", "x"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "graphrt: error: unknown command 'srve' (commands: serve" in err
    with pytest.raises(SystemExit) as e:
        graphrt_cli.main(["--bogus"])
    assert e.value.code == 2 and "unknown option '--bogus'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        graphrt_cli.main(["--help"])
    assert e.value.code == 0 and "serve" in capsys.readouterr().out


def test_busy_port_fails_before_the_model_loads(tmp_path_factory, capsys, monkeypatch):
    from graphrt.serve import cli as serve_cli
    ckpt = write(tmp_path_factory, "busy", arch="llama", dtype="float32", seed=5)
    calls = []
    monkeypatch.setattr(serve_cli, "load", lambda args, **kw: calls.append(args))   # must not be reached
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        t0 = time.perf_counter()
        with pytest.raises(SystemExit) as e:
            serve_main(["--model", str(ckpt), "--device", "cpu", "--port", str(port)])
        elapsed = time.perf_counter() - t0
    err = capsys.readouterr().err
    assert e.value.code == 2 and calls == [] and elapsed < 5
    assert err.strip() == (f"graphrt serve: error: --port: 127.0.0.1:{port} is already in use; stop the other "
                           f"server or choose another --port")
    with pytest.raises(SystemExit) as e:
        serve_main(["--model", str(ckpt), "--port", str(_free_port()), "--stats-interval", "-1"])
    assert e.value.code == 2 and "--stats-interval: must be >= 0 seconds, got -1.0" in capsys.readouterr().err


def test_bind_socket_binds_the_address_uvicorn_serves():
    """The socket bound before loading is the one uvicorn listens on: once listening, the port
    is refused to another bind_socket; closed, it is free again."""
    from graphrt.serve.cli import bind_socket
    port = _free_port()
    sock = bind_socket("127.0.0.1", port)
    assert sock.getsockname() == ("127.0.0.1", port)
    sock.listen()
    try:
        with pytest.raises(ValueError, match=f"^--port: 127.0.0.1:{port} is already in use"):
            bind_socket("127.0.0.1", port)
    finally:
        sock.close()
    bind_socket("127.0.0.1", port).close()              # free again
    with pytest.raises(ValueError, match="^--host: cannot resolve 'no such host'"):
        bind_socket("no such host", port)


def test_chat_delta_leaves_out_unset_fields():
    from graphrt.serve.protocol import ChatChunkChoice, ChatCompletionChunk, ChatDelta

    def delta(**kw):
        chunk = ChatCompletionChunk(id="x", model="m", choices=[ChatChunkChoice(delta=ChatDelta(**kw))])
        return json.loads(chunk.model_dump_json())["choices"][0]["delta"]
    assert delta(role="assistant", content="") == {"role": "assistant", "content": ""}
    assert delta(content="hi") == {"content": "hi"}
    assert delta() == {}


def test_stats_line():
    from graphrt.serve.stats_log import Sample, stats_line
    a = Sample(10.0, 100, 50, 2, 1, 10, 30)
    b = Sample(12.0, 612, 240, 3, 0, 16, 24)
    assert stats_line(a, b) == ("stats: running 3, waiting 0 | prompt 256.0 tok/s, generation 95.0 tok/s | "
                                "KV 40.0% used (16/40 pages)")
    idle = Sample(14.0, 612, 240, 0, 0, 0, 40)
    assert stats_line(b, idle) is None
    assert stats_line(b, Sample(14.0, 612, 250, 0, 0, 0, 40)).startswith("stats: running 0, waiting 0 | "
                                                                          "prompt 0.0 tok/s, generation 5.0")


def _get(url: str, body: dict | None = None, timeout: float = 60.0):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the CPU default: a machine without CUDA")
def test_serve_on_cpu_without_env_streams_logs_stats_and_refusals(tmp_path_factory, tmp_path):
    """`graphrt serve --model DIR` as a user starts it on a CPU machine (no --device, no
    TRITON_INTERPRET): it serves; streamed chat deltas carry the role only in the first chunk;
    the log has a stats line while busy and says why a request was refused."""
    ckpt = write(tmp_path_factory, "live", arch="llama", dtype="float32", seed=8)
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    log_file = tmp_path / "serve.log"
    with open(log_file, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "graphrt.cli", "serve", "--model", str(ckpt),
                                 "--served-model-name", "tiny", "--port", str(port), "--stats-interval", "0.2"],
                                env=env, stdout=out, stderr=subprocess.STDOUT, cwd=str(tmp_path))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if _get(base + "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None, log_file.read_text()[-3000:]
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.3)
        status, text = _get(base + "/v1/chat/completions", {
            "model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "stream": True,
            "max_tokens": 12, "temperature": 0, "ignore_eos": True})
        assert status == 200, text
        events = [json.loads(line[6:]) for line in text.splitlines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
        deltas = [e["choices"][0]["delta"] for e in events]
        assert deltas[0]["role"] == "assistant" and len(deltas) >= 3
        assert all("role" not in d for d in deltas[1:]) and all(None not in d.values() for d in deltas)
        assert '"role":null' not in text.replace(" ", "")
        status, text = _get(base + "/v1/completions", {"model": "llama8b", "prompt": "Hi"})
        assert status == 400 and "'tiny'" in text, text
        time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    log = log_file.read_text()
    assert "on cpu" in log and "serving 'tiny'" in log, log[-3000:]
    assert "stats: running " in log and " tok/s | KV " in log, log[-3000:]
    assert "refused POST /v1/completions: 400 model: " in log, log[-3000:]


def test_bench_serve_cpu_smoke(tmp_path_factory, tmp_path):
    """The benchmark end to end on CPU: the real `graphrt serve` subprocess (its start-up log),
    streaming clients at N = 1, 2, and the HF generate baseline; every request completes."""
    ckpt = write(tmp_path_factory, "bench", arch="llama", dtype="float32", seed=5)
    bench = tool_module("bench_serve")
    res = bench.main(["--model", str(ckpt), "--device", "cpu", "--variants", "graphrt,graphrt-hostplan,hf",
                      "--concurrency", "1,2", "--requests", "1", "--output-len", "4", "--prompt-lens", "3,9",
                      "--out-dir", str(tmp_path), "--name", "smoke", "--time-budget-s", "120"])
    for variant in ("graphrt", "hf"):
        for n in (1, 2):
            r = res["variants"][variant][n]
            assert r["requests"] == n and not r["errors"], r
            assert 0 < r["ttft_p50_ms"] <= r["ttft_p99_ms"] and 0 < r["tpot_p50_ms"] <= r["tpot_p99_ms"]
            assert r["tokens_per_s"] > 0
    assert "skipped" in res["variants"]["graphrt-hostplan"]
    saved = json.loads((tmp_path / "smoke.json").read_text())
    assert set(saved["variants"]) == {"graphrt", "graphrt-hostplan", "hf"}
    assert "| graphrt | 2 | 2 |" in (tmp_path / "smoke.md").read_text()
    assert set(res["graph_step_ms"]) == {1, 2} and all(v > 0 for v in res["graph_step_ms"].values())
    log = (tmp_path / "smoke_graphrt.log").read_text()
    for line in ("loading ", "weights: llama torch.float32", "tokenizer + runtime: ",
                 "engine: backend torch-splitkv", "serving 'bench'"):
        assert line in log, log


def test_capture_report_sums_the_runtime_capture_stats():
    from types import SimpleNamespace

    from graphrt.attention.graphs import CaptureStats, GraphKey
    from graphrt.serve.cli import capture_report
    keys = [GraphKey("decode", 1), GraphKey("decode", 2), GraphKey("decode", 1, sampled=True),
            GraphKey("decode", 2, sampled=True)]
    stats = [CaptureStats(1, 10.0, 500.0, 2**20), CaptureStats(2, 20.0, 100.0, 2**20),
             CaptureStats(1, 30.0, 400.0, 2**21), CaptureStats(2, 0.0, 0.0, 0)]
    llm = SimpleNamespace(runtime=SimpleNamespace(graphs=SimpleNamespace(stats=dict(zip(keys, stats)))),
                          checkpoint=SimpleNamespace(load_s=2.0))
    assert capture_report(llm, 5.0) == [
        "kernels (graph warm-up: compile or load from cache, first touch): 1.00 s",
        "graph capture: 4 graphs (2 per bucket) in 0.06 s, 4.0 MiB",
        "tokenizer + runtime construction: 1.94 s"]
    eager = SimpleNamespace(runtime=SimpleNamespace(graphs=SimpleNamespace(stats={})),
                            checkpoint=SimpleNamespace(load_s=2.0))
    assert capture_report(eager, 3.5) == ["tokenizer + runtime: 1.50 s (no CUDA graphs: eager decode)"]
