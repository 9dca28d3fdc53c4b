"""Logits processing and log-probabilities in the captured CUDA graphs (processed decode graphs,
K = 4, bf16) against HF float32 on the GPU: a greedy neighbour in the same blocks equals HF's
greedy (up to bf16 ties); the processed request's tokens are the argmax of HF's penalised logits
(HF's RepetitionPenaltyLogitsProcessor + OpenAI's presence / frequency rule) up to bf16 ties, and
its log-probs and prompt log-probs are HF's log_softmax within bf16 tolerance."""
from __future__ import annotations

import pytest
import torch

from _checkpoints import BF16_GAP, assert_greedy_matches_hf, write

pytestmark = pytest.mark.gpu
transformers = pytest.importorskip("transformers")
N = 9


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write(tmp_path_factory, "samp_gpu", arch="llama", dtype="bfloat16", seed=11)


def _logits(hf, seq):
    with torch.no_grad():
        return hf(torch.tensor([seq], device="cuda")).logits[0].float().cpu()


def test_processed_graphs_match_hf(path):
    from graphrt import LLM, SamplingParams
    llm = LLM(path, device="cuda", max_batch=4, steps_per_graph=4, max_model_len=128)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).cuda().eval()
    prompts = [[7, 8, 9, 10, 11, 12], [100, 7, 100, 7, 100]]
    plain, proc = llm.generate(prompts, [
        SamplingParams(max_tokens=N, temperature=0, ignore_eos=True),
        SamplingParams(max_tokens=N, temperature=0, ignore_eos=True, logprobs=5, prompt_logprobs=2,
                       repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.2)])
    assert_greedy_matches_hf(hf, prompts[0], plain.token_ids)
    prompt, out = prompts[1], proc.token_ids
    rep = transformers.RepetitionPenaltyLogitsProcessor(1.3)
    logp = torch.log_softmax(_logits(hf, prompt + out), -1)
    for t, tok in enumerate(out):
        seq = prompt + out[:t]
        x = rep(torch.tensor([seq]), _logits(hf, seq)[-1:])[0]
        c = torch.bincount(torch.tensor(out[:t], dtype=torch.long), minlength=x.numel()).float()
        x = x - 0.5 * (c > 0) - 0.2 * c
        assert float(x.max() - x[tok]) <= BF16_GAP * abs(float(x.max())) + 1e-3, (t, tok, int(x.argmax()))
        assert abs(proc.logprobs[t][tok].logprob - float(logp[len(prompt) - 1 + t, tok])) < 0.05
    for s in range(1, len(prompt)):
        assert abs(proc.prompt_logprobs[s][prompt[s]].logprob - float(logp[s - 1, prompt[s]])) < 0.05
    alloc = llm.engine.scheduler.allocator
    assert alloc.num_free == alloc.num_pages
