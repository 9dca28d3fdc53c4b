"""RuntimeOptions (graphrt/model/options.py): every ModelRuntime knob one validated field, the
environment's GRAPHRT_* variables read in one place and only overriding fields, and the deep
modules (split-K, persistent step, graph runner, PDL) taking their knob as an argument.
CPU; a tiny random model where a runtime is built."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from graphrt import RuntimeConfig
from graphrt.engine.config import EngineConfig
from graphrt.kernels.launch import pdl_scope, use_pdl
from graphrt.model import LlamaDecoder
from graphrt.model.options import ENV, RuntimeOptions, env_overrides
from graphrt.model.runtime import ModelRuntime

transformers = pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[2] / "graphrt"


@pytest.fixture
def clean_env(monkeypatch):
    for var in ENV:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def _model():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=128, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                                   max_position_embeddings=128, tie_word_embeddings=False)
    return LlamaDecoder.from_hf(transformers.LlamaForCausalLM(cfg).eval())


def _config():
    return RuntimeConfig(num_qo_heads=2, num_kv_heads=1, head_dim=64, page_size=16, max_context_len=64,
                         buckets=[1, 2], dtype="float32", backend="torch", kv_pool_pages=8)


@pytest.mark.parametrize("field,value", [
    ("backend", "cudnn"), ("steps_per_graph", 0), ("steps_per_graph", "four"), ("num_pages", 0),
    ("sampling", 1), ("keep_logits", "yes"), ("fallback_to_one_step", None), ("token_history", 0),
    ("processing", "on"), ("prefill_chunk_tokens", 0), ("logprobs_mode", "clipped"), ("logprobs_width", -1),
    ("prefill_graph_tokens", -1), ("prefill_graph_tokens", 1.5), ("graphed_prefill", 1), ("graphed_prefill", "yes"),
    ("splitk", 3), ("splitk", True), ("mixed_prefill_tokens", -1), ("decode_backend", "fused"),
    ("graph_warmup", 0), ("graph_warmup", True), ("pdl", 1), ("persistent_cooperative", "0"),
    ("persistent_prefetch", 9), ("persistent_prefetch", -1), ("persistent_stages", 17), ("persistent_stages", True),
    ("persistent_stages", None),
])
def test_a_bad_field_is_refused_naming_it(field, value):
    with pytest.raises(ValueError, match=rf"^{field}:"):
        RuntimeOptions(**{field: value})


def test_defaults_and_normalised_values():
    o = RuntimeOptions()
    assert (o.steps_per_graph, o.splitk, o.decode_backend, o.graph_warmup, o.pdl, o.persistent_cooperative,
            o.persistent_prefetch, o.persistent_stages, o.graphed_prefill) == (1, "auto", "sequence", 1, True, True,
                                                                                None, 0, None)
    o = RuntimeOptions(splitk="2", decode_backend="Persistent", steps_per_graph="auto")
    assert o.splitk == 2 and o.decode_backend == "persistent" and o.steps_per_graph == "auto"
    assert o.replace(pdl=False).pdl is False and o.replace() is o
    with pytest.raises(ValueError, match=r"^options: unknown field\(s\) \['fuse'\]"):
        o.replace(fuse=True)


def test_the_environment_overrides_fields(clean_env):
    env = {"GRAPHRT_SPLITK": "4", "GRAPHRT_DECODE_BACKEND": "AUTO", "GRAPHRT_GRAPH_WARMUP": "2",
           "GRAPHRT_PDL": "0", "GRAPHRT_PERSISTENT_COOPERATIVE": "0", "GRAPHRT_PERSISTENT_PREFETCH": "3",
           "GRAPHRT_PERSISTENT_STAGES": "6"}
    assert env_overrides(env) == {"splitk": 4, "decode_backend": "auto", "graph_warmup": 2, "pdl": False,
                                  "persistent_cooperative": False, "persistent_prefetch": 3, "persistent_stages": 6}
    assert set(ENV) == set(env)
    given = RuntimeOptions(splitk=1, decode_backend="persistent", pdl=True)
    o = given.with_env(env)
    assert (o.splitk, o.decode_backend, o.pdl, o.graph_warmup) == (4, "auto", False, 2)   # the variables win
    assert given.with_env({}) is given and env_overrides({"GRAPHRT_SPLITK": "  "}) == {}  # unset / empty
    assert env_overrides({"GRAPHRT_PDL": "1", "OTHER": "x"}) == {"pdl": True}
    clean_env.setenv("GRAPHRT_SPLITK", "2")
    assert RuntimeOptions().with_env().splitk == 2                                     # os.environ by default


@pytest.mark.parametrize("var,value,allowed", [
    ("GRAPHRT_SPLITK", "3", "'auto', 0, 1, 2 or 4"), ("GRAPHRT_DECODE_BACKEND", "fast", "sequence"),
    ("GRAPHRT_GRAPH_WARMUP", "0", "an int >= 1"), ("GRAPHRT_PDL", "off", "0 or 1"),
    ("GRAPHRT_PERSISTENT_COOPERATIVE", "yes", "0 or 1"), ("GRAPHRT_PERSISTENT_PREFETCH", "9", r"\[0, 8\]"),
    ("GRAPHRT_PERSISTENT_STAGES", "17", r"\[0, 16\]"),
])
def test_a_bad_variable_is_refused_naming_it_and_its_values(var, value, allowed):
    with pytest.raises(ValueError, match=rf"^{var}: expected .*{allowed}"):
        env_overrides({var: value})


def test_model_runtime_reads_the_environment_once_at_construction(clean_env):
    model, cfg = _model(), _config()
    clean_env.setenv("GRAPHRT_SPLITK", "2")
    clean_env.setenv("GRAPHRT_GRAPH_WARMUP", "3")
    clean_env.setenv("GRAPHRT_PDL", "0")
    mrt = ModelRuntime(model, cfg, "cpu", options=RuntimeOptions(splitk=1, keep_logits=True))
    assert mrt.options.splitk == 2 and mrt.options.keep_logits and mrt.keep_logits
    assert (mrt.graphs.warmup_steps, mrt.graphs.pdl) == (3, False)
    clean_env.setenv("GRAPHRT_SPLITK", "4")                    # after construction: not read again
    clean_env.setenv("GRAPHRT_DECODE_BACKEND", "bogus")
    clean_env.setenv("GRAPHRT_PDL", "bogus")
    mrt._plan_splitk()
    assert mrt.splitk.source == "fixed" and set(mrt.splitk.table.values()) == {(2, 2)}
    assert mrt.persistent.source == "off"
    clean_env.delenv("GRAPHRT_DECODE_BACKEND")
    clean_env.delenv("GRAPHRT_PDL")
    # keywords are the same fields (a shorthand for options.replace); bad ones name the field
    got = ModelRuntime(model, cfg, "cpu", splitk=1, sampling=True).options
    assert got == RuntimeOptions(splitk=4, sampling=True, graph_warmup=3)
    with pytest.raises(ValueError, match=r"^options: unknown field"):
        ModelRuntime(model, cfg, "cpu", fuse=True)
    with pytest.raises(ValueError, match=r"^options: expected a RuntimeOptions"):
        ModelRuntime(model, cfg, "cpu", options={"splitk": 1})
    clean_env.setenv("GRAPHRT_SPLITK", "8")
    with pytest.raises(ValueError, match=r"^GRAPHRT_SPLITK"):
        ModelRuntime(model, cfg, "cpu")


def test_the_persistent_knobs_reach_the_step(clean_env):
    clean_env.setenv("GRAPHRT_PERSISTENT_COOPERATIVE", "0")
    clean_env.setenv("GRAPHRT_PERSISTENT_PREFETCH", "2")
    clean_env.setenv("GRAPHRT_PERSISTENT_STAGES", "3")
    mrt = ModelRuntime(_model(), _config(), "cpu", decode_backend="persistent")
    assert (mrt.options.persistent_cooperative, mrt.options.persistent_prefetch) == (False, 2)
    assert mrt.options.persistent_stages == 3
    mrt._plan_splitk()
    step = mrt.persistent.get(1)
    assert mrt.persistent.source == "fixed" and step is not None
    assert step.prefetch == 0 and not step.cooperative        # off the GPU: no prefetch, one program
    assert step.stages == 3 and step.constexprs["STAGES"] == 3


def test_the_engine_builds_its_options():
    c = EngineConfig(max_batch=2, steps_per_graph=3, mixed_prefill_tokens=16, capture=False)
    o = c.runtime_options()
    assert (o.steps_per_graph, o.sampling, o.fallback_to_one_step, o.processing, o.token_history,
            o.graphed_prefill, o.mixed_prefill_tokens) == (3, True, True, True, False, False, 16)
    assert not EngineConfig(max_batch=2).runtime_options(tensor_parallel=True).processing


def test_pdl_scope():
    assert not use_pdl(torch.empty(0))                          # not CUDA: never PDL
    with pdl_scope(False):
        with pdl_scope(False):                                  # the same setting nests
            pass
        with pytest.raises(RuntimeError, match="pdl: a scope with pdl=True inside one with pdl=False"):
            with pdl_scope(True):
                pass
    with pytest.raises(ValueError, match="^pdl: expected a bool"):
        with pdl_scope("0"):
            pass


# modules that may read the environment: the options (the one reader of the GRAPHRT_* knobs) and
# what is not a runtime knob (the Triton / FlashInfer / Hugging Face set-up, the server's flags)
ENV_READERS = {"model/options.py", "attention/flashinfer_lean.py", "cache/load.py", "checkpoint/hub.py",
               "engine/device.py", "kernels/token_mask.py", "serve/flags.py"}


def test_no_other_module_reads_the_environment():
    found = set()
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") \
                    and isinstance(node.value, ast.Name) and node.value.id == "os":
                found.add(path.relative_to(ROOT).as_posix())
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in ENV \
                    and path.relative_to(ROOT).as_posix() != "model/options.py":
                found.add(path.relative_to(ROOT).as_posix() + ": " + node.value)
    assert found <= ENV_READERS, sorted(found - ENV_READERS)
    for deep in ("model/splitk.py", "model/persistent.py", "kernels/persistent/step.py", "attention/graphs.py",
                 "kernels/launch.py"):
        assert deep not in found
