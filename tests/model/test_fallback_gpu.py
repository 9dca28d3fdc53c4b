"""GPU test of the host-planning fallback: a FlashInfer version the device planner does not know.

`LLM(path)` must start (K = 1, a warning naming the version), capture, replay and give the same
greedy tokens as the device-planned run of the same checkpoint, except where the two split-KV
schedules round a near-tie differently (random bf16 weights): each divergence's float32 top-2 gap
must be a tie by tests/_checkpoints.BF16_GAP, and both runs must follow HF float32 up to near-ties.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from _checkpoints import BF16_GAP, assert_greedy_matches_hf, write
from graphrt import LLM, SamplingParams

pytestmark = pytest.mark.gpu
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return write(tmp_path_factory, "fallback", shape="llama-3.2-1b", arch="llama", dtype="bfloat16",
                 num_layers=2, max_shard_mb=1024, tokenizer_vocab=4096)


def test_unknown_flashinfer_version_runs_k1_with_host_planning(path, monkeypatch):
    prompts = [list(range(10, 10 + n)) for n in (5, 37, 130)]
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    device = LLM(path, device="cuda", max_batch=4, steps_per_graph=4, max_model_len=512)
    want = [o.token_ids for o in device.generate(prompts, params, use_tqdm=False)]
    assert device.runtime.caps.steps_per_graph == 4
    device.shutdown()
    del device
    from graphrt.attention import flashinfer_layout
    monkeypatch.setattr(flashinfer_layout, "KNOWN_VERSIONS", ("0.0.0-none",))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        host = LLM(path, device="cuda", max_batch=4, steps_per_graph=4, max_model_len=512)
    text = " ".join(str(w.message) for w in seen)
    assert "device planning refused" in text and "0.7" in text, text   # names the version
    assert "running 1 step per graph" in text, text
    assert host.runtime.caps.steps_per_graph == 1
    got = [o.token_ids for o in host.generate(prompts, params, use_tqdm=False)]
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).cuda().eval()
    margins = []
    for pr, a, b in zip(prompts, want, got):
        assert len(b) == 20
        assert_greedy_matches_hf(hf, pr, a)
        assert_greedy_matches_hf(hf, pr, b)               # host planning follows the float32 truth
        if a != b:
            i = next(j for j, (x, y) in enumerate(zip(a, b)) if x != y)
            with torch.no_grad():
                logits = hf(torch.tensor([pr + a[:i]], device="cuda")).logits[0, -1].float()
            top = torch.topk(logits, 2).values
            margins.append(float((top[0] - top[1]) / top[0].abs()))
    print(f"\nhost-planned vs device-planned: {len(prompts) - len(margins)}/{len(prompts)} identical; "
          f"divergence margins {margins} (tie: <= {BF16_GAP})")
    assert all(m <= BF16_GAP for m in margins)
    del hf
    # sampled graphs replay too
    s = host.generate(prompts[:1], SamplingParams(max_tokens=8, temperature=0.8, seed=3, ignore_eos=True),
                      use_tqdm=False)[0]
    assert len(s.token_ids) == 8
