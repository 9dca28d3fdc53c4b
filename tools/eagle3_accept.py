"""Offline acceptance length of an EAGLE-3 head (or a draft model) on held-out completion, greedy.

    python tools/eagle3_accept.py --target DIR/target --head DIR/eagle3 [--draft DIR/draft]
        [--k 4] [--prompts 16] [--prompt-tokens 128] [--new-tokens 128] [--device cuda]

For each held-out prompt (the first --prompt-tokens tokens of a held-out file of
tools/train_tiny.py's split), the target's greedy continuation is generated once (HF
transformers) and its hidden states over prompt + continuation are recorded (one forward,
`output_hidden_states`, the head's layer ids). Speculative rounds are then replayed offline
with graphrt's head forward (`Eagle3Drafter`: prefill, draft-extend, chain, its own paged KV):
a round proposes k tokens, accepts the prefix that matches the target's greedy tokens and
emits it plus the target's next token. Acceptance length = emitted tokens / rounds (vLLM's
"mean acceptance length", the target's token included; 1.0 = nothing accepted). Only rounds
with k comparable tokens left are counted. With --draft, a draft model's greedy chain is
measured on the same rounds' prefixes. Prints a table; --json writes the numbers.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def heldout_prompts(tok, n: int, prompt_tokens: int, min_tokens: int) -> list[list[int]]:
    """The first prompt_tokens tokens (bos first) of the first n held-out files long enough."""
    from train_tiny import BOS, read_split
    out = []
    for _, text in read_split(True):
        ids = [BOS] + tok.backend_tokenizer.encode(text, add_special_tokens=False).ids
        if len(ids) >= min_tokens:
            out.append(ids[:prompt_tokens])
        if len(out) == n:
            break
    return out


@torch.no_grad()
def target_path(target, prompt: list[int], new_tokens: int, layer_ids) -> tuple[list[int], torch.Tensor]:
    """The target's greedy continuation (prompt + up to new_tokens tokens) and its recorded
    hidden states [N, 3H] over that sequence (model dtype, on the target's device)."""
    dev = next(target.parameters()).device
    x = torch.tensor([prompt], device=dev)
    seq = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens, do_sample=False,
                          pad_token_id=0)[0]                     # stops early at EOS
    hs = target(input_ids=seq[None], output_hidden_states=True, use_cache=False).hidden_states
    if max(layer_ids) >= len(hs) - 1:
        raise ValueError(f"layer_ids: {list(layer_ids)}: id {len(hs) - 1} (after the final layer) is not "
                         "recorded by transformers' output_hidden_states (it is post-norm there)")
    return seq.tolist(), torch.cat([hs[i][0] for i in layer_ids], dim=-1)


def replay(propose_first, propose_next, seq: list[int], start: int, k: int) -> tuple[int, int]:
    """Greedy rounds over a known target path: returns (rounds, emitted tokens). seq[start] is
    the last token known before the first round (the target's first sampled token: start = the
    prompt length). propose_first() -> k proposals after seq[:start + 1]; propose_next(n, a)
    -> the next k proposals after the round that verified at position n accepted a."""
    n, rounds, emitted = start, 0, 0
    props = propose_first()
    while n + k + 1 <= len(seq) - 1:
        truth = seq[n + 1: n + 1 + k]
        a = 0
        while a < k and props[a] == truth[a]:
            a += 1
        rounds, emitted = rounds + 1, emitted + a + 1
        props = propose_next(n, a)
        n += a + 1
    return rounds, emitted


def eagle_rounds(ck, head_embed, seq, h3, prompt_len, k, max_positions) -> tuple[int, int]:
    """replay() with graphrt's Eagle3Drafter (batch 1, its own paged KV)."""
    from graphrt.attention.kvcache import PagedKVCache
    from graphrt.speculative.eagle3 import Eagle3Drafter, Eagle3Head
    c, dev, dt = ck.config, ck.weights.device, ck.weights.dtype
    head = Eagle3Head(c, ck.weights, target_embed=head_embed, max_positions=max_positions)
    page = 16
    pages = (len(seq) + 2 * k + page) // page
    cache = PagedKVCache(torch.zeros(pages, page, c.num_kv_heads, c.head_dim, dtype=dt, device=dev),
                         torch.zeros(pages, page, c.num_kv_heads, c.head_dim, dtype=dt, device=dev))
    table = torch.arange(pages, dtype=torch.int32, device=dev)[None].contiguous()
    drafter = Eagle3Drafter(head, cache, k, max_len=len(seq) + 2 * k)
    err = torch.zeros(1, dtype=torch.int32, device=dev)
    props = torch.empty(1, k, dtype=torch.int64, device=dev)
    seq_dev = torch.tensor(seq + [0] * (k + 2), device=dev)
    h3 = torch.cat([h3, h3.new_zeros(k + 2, h3.shape[1])]).to(dt)

    def first():
        drafter.prefill(h3[:prompt_len], seq_dev[1: prompt_len + 1], [prompt_len], table, props, err)
        return props[0].tolist()

    def nxt(n, a):
        emitted = seq_dev[n + 1: n + k + 2].clone()[None]
        emitted[0, a + 1:] = -1
        drafter.round(h3[None, n: n + k + 1], emitted, torch.tensor([n], dtype=torch.int32, device=dev),
                      torch.tensor([a + 1], dtype=torch.int32, device=dev), table, props, err)
        return props[0].tolist()

    with torch.no_grad():
        out = replay(first, nxt, seq, prompt_len, k)
    if int(err):
        raise RuntimeError(f"head K/V append flagged device_error {int(err)}")
    return out


def draft_rounds(draft, seq, prompt_len, k) -> tuple[int, int]:
    """replay() with a draft model's greedy k tokens after each prefix (HF generate)."""
    dev = next(draft.parameters()).device

    def after(n):
        x = torch.tensor([seq[: n + 1]], device=dev)
        out = draft.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=k, do_sample=False,
                             pad_token_id=0)[0, n + 1:].tolist()
        return out + [-1] * (k - len(out))                        # stopped at EOS

    with torch.no_grad():
        return replay(lambda: after(prompt_len), lambda n, a: after(n + a + 1), seq, prompt_len, k)


def measure(target_dir, head_dir, *, k=4, prompts=16, prompt_tokens=128, new_tokens=128, device="cpu",
            draft_dir=None, log=print) -> dict:
    """Acceptance lengths (head, and draft when given) over held-out prompts; see module doc."""
    import transformers
    from graphrt.model.spec import LlamaSpec
    from graphrt.speculative.eagle3 import load_eagle3
    dev = torch.device(device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    target = transformers.AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=dtype).to(dev).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(target_dir))
    spec = LlamaSpec.from_hf(target.config)
    ck = load_eagle3(head_dir, spec, dtype=dtype, device=dev)
    embed = target.get_input_embeddings().weight.detach()
    draft = None
    if draft_dir is not None:
        draft = transformers.AutoModelForCausalLM.from_pretrained(str(draft_dir), dtype=dtype).to(dev).eval()
    res = {"k": k, "prompts": 0, "head": [0, 0], "draft": [0, 0]}
    t0 = time.perf_counter()
    for p in heldout_prompts(tok, prompts, prompt_tokens, prompt_tokens + 8):
        seq, h3 = target_path(target, p, new_tokens, ck.layer_ids)
        r, e = eagle_rounds(ck, embed, seq, h3, len(p), k, spec.max_position_embeddings)
        res["head"] = [res["head"][0] + r, res["head"][1] + e]
        if draft is not None:
            r, e = draft_rounds(draft, seq, len(p), k)
            res["draft"] = [res["draft"][0] + r, res["draft"][1] + e]
        res["prompts"] += 1
    out = {"k": k, "prompts": res["prompts"], "prompt_tokens": prompt_tokens, "new_tokens": new_tokens,
           "device": str(dev), "dtype": str(dtype).removeprefix("torch."), "seconds": round(time.perf_counter() - t0, 1)}
    for name in ("head", "draft"):
        rounds, emitted = res[name]
        if rounds:
            out[name] = {"rounds": rounds, "emitted": emitted, "acceptance_length": round(emitted / rounds, 3)}
    log(f"{'proposer':<10}{'rounds':>8}{'emitted':>9}{'accept len (k=' + str(k) + ')':>20}")
    for name in ("head", "draft"):
        if name in out:
            log(f"{name:<10}{out[name]['rounds']:>8}{out[name]['emitted']:>9}{out[name]['acceptance_length']:>20.3f}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True)
    p.add_argument("--head", required=True)
    p.add_argument("--draft", default=None)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    for name in ("k", "prompts", "prompt_tokens", "new_tokens"):
        if getattr(a, name) < 1:
            print(f"eagle3_accept: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    from graphrt.engine.device import select_triton_mode
    from graphrt.checkpoint.hf_files import CheckpointError
    select_triton_mode(torch.device(a.device))
    try:
        out = measure(a.target, a.head, k=a.k, prompts=a.prompts, prompt_tokens=a.prompt_tokens,
                      new_tokens=a.new_tokens, device=a.device, draft_dir=a.draft)
    except (CheckpointError, ValueError, OSError) as e:
        print(f"eagle3_accept: {e}", file=sys.stderr)
        return 2
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
