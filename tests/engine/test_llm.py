"""graphrt.LLM on CPU (engine/llm.py): greedy tokens equal HF transformers' generate for Llama,
Qwen2, Qwen3 checkpoints written to disk (several prompts of different lengths batched, K-step
blocks), chat through the template, and bad input."""
from __future__ import annotations

import pytest
import torch

from _checkpoints import write
from graphrt import LLM, SamplingParams
from graphrt.engine import EngineConfig

transformers = pytest.importorskip("transformers")
PROMPTS = ["Hello world", [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], "the graph token",
           [42]]


def _hf_greedy(path, prompt_ids, n):
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None          # the engine runs with ignore_eos
    out = []
    for ids in prompt_ids:
        r = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0)
        out.append(r[0, len(ids):].tolist())
    return out


@pytest.mark.parametrize("arch,shard,k", [("llama", None, 3), ("qwen2", 0.3, 4), ("qwen3", None, 1)])
def test_greedy_equals_hf_generate(tmp_path_factory, arch, shard, k):
    path = write(tmp_path_factory, arch, arch=arch, dtype="float32", max_shard_mb=shard, seed=2)
    llm = LLM(path, device="cpu", max_batch=4, steps_per_graph=k)
    params = SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True)
    outs = llm.generate(PROMPTS, params)
    ref = _hf_greedy(path, [o.prompt_token_ids for o in outs], 9)
    assert [o.token_ids for o in outs] == ref
    assert all(o.finish_reason == "length" for o in outs)
    assert outs[0].prompt_token_ids == llm.tokenizer("Hello world").input_ids
    assert outs[2].text == llm.tokenizer.decode(outs[2].token_ids, skip_special_tokens=True)
    alloc = llm.engine.scheduler.allocator
    assert alloc.num_free == alloc.num_pages


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return LLM(write(tmp_path_factory, "llm", arch="llama", dtype="bfloat16"), device="cpu", max_batch=2,
               steps_per_graph=2, max_model_len=64)


def test_cpu_runs_float32_and_chat_uses_the_template(llm):
    assert llm.checkpoint.dtype == torch.float32 and llm.runtime.caps.config.dtype == "float32"
    msgs = [{"role": "user", "content": "Hi there"}]
    out = llm.chat(msgs, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    ids = llm.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    want = llm.tokenizer(ids).input_ids
    assert out.prompt_token_ids == want
    assert out.token_ids == llm.generate(want, SamplingParams(max_tokens=4, temperature=0,
                                                              ignore_eos=True))[0].token_ids


@pytest.mark.parametrize("kwargs,field", [
    (dict(temperature=-0.1), "temperature"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
    (dict(max_tokens=0), "max_tokens"), (dict(max_tokens=2.5), "max_tokens"), (dict(top_k=-2), "top_k"),
    (dict(seed=-1), "seed"), (dict(stop=[""]), "stop"), (dict(stop_token_ids=[-3]), "stop_token_ids"),
    (dict(temperature=float("nan")), "temperature"), (dict(ignore_eos=1), "ignore_eos")])
def test_bad_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        SamplingParams(**kwargs)


def test_bad_prompts_and_config_name_the_field(llm):
    with pytest.raises(ValueError, match="max_tokens: 16 \\+ the prompt's 60 tokens exceed max_model_len 64"):
        llm.generate([[5] * 60])
    with pytest.raises(ValueError, match="prompt: 64 tokens leave no room to generate in max_model_len 64"):
        llm.generate([[5] * 64], SamplingParams(max_tokens=1))
    with pytest.raises(ValueError, match="prompt: empty"):
        llm.generate([[]])
    with pytest.raises(ValueError, match="prompt: token id 9999 outside the vocabulary"):
        llm.generate([[1, 9999]])
    with pytest.raises(ValueError, match="prompt: token id -1 outside the vocabulary"):
        llm.generate([[4] * 3000 + [-1, 7]])
    with pytest.raises(ValueError, match=f"prompt: token id {2**64} outside the vocabulary"):
        llm.generate([[4, 2**64]])                           # beyond int64
    with pytest.raises(ValueError, match=f"prompt: token id {2**64} outside the vocabulary"):
        llm.generate([[4] * 100 + [2**64]])                  # beyond int64, a long prompt (numpy)
    for bad in ([1, True], [1, 2.0], [1, "2"]):              # bool / float / str ids
        with pytest.raises(ValueError, match="prompt: expected a string or a list of token ids"):
            llm.generate([bad])
    with pytest.raises(ValueError, match="prompt: expected a string"):
        llm.generate([3.5])
    with pytest.raises(ValueError, match="sampling_params: 1 given for 2 prompts"):
        llm.generate(["a", "b"], [SamplingParams()])
    with pytest.raises(ValueError, match="messages"):
        llm.chat("hi")
    with pytest.raises(ValueError, match="max_batch"):
        EngineConfig(max_batch=0)
    with pytest.raises(ValueError, match="backend"):
        EngineConfig(backend="fast")
    with pytest.raises(ValueError, match="device"):
        LLM(llm.checkpoint.path, device="tpu")
    with pytest.raises(ValueError, match="max_model_len: 999 exceeds"):
        LLM(llm.checkpoint.path, device="cpu", max_model_len=999)
    alloc = llm.engine.scheduler.allocator
    assert alloc.num_free == alloc.num_pages        # refused requests took nothing
