"""Log-probabilities on the device: of each drawn token, its rank, and the top-n alternatives.

    lp = LogprobBuffers.allocate(steps=K, max_batch=B, width=20, device=dev)
    lp.record(step, size, logp_source, tokens)        # inside a graphed step (capturable)
    tok, rank, ids, vals = lp.view(n)                  # views of the first n rows, valid until the next block

`logp_source` is the distribution the log-probabilities are taken of: the raw model logits
(float32, "raw" mode, as HF's log_softmax of the logits) or the processed ones ("processed": the
logits after penalties / bias / bans, divided by the temperature, -inf outside the sampler's kept
set; see model/processing.py). Ranks count the tokens strictly more likely, plus one (1 = the
most likely). Every row of the block is recorded (padding rows too: their values are unread).

`prompt_logprobs` computes the same for prompt positions from prefill logits (eager, outside
graphs).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


def token_logprobs(logp_source: torch.Tensor, targets: torch.Tensor, width: int):
    """logp_source [R, V] float, targets [R] int64 -> (logprob [R] float32, rank [R] int32,
    top ids [R, width] int64, top logprobs [R, width] float32). Capturable (no sync)."""
    lp = torch.log_softmax(logp_source.float(), dim=-1)                       # [R, V]
    tok = lp.gather(1, targets[:, None])                                       # [R, 1]
    rank = (lp > tok).sum(dim=1, dtype=torch.int32) + 1
    if width:
        vals, ids = torch.topk(lp, width, dim=-1)                              # [R, width] each
    else:
        vals = lp.new_zeros((lp.shape[0], 0))
        ids = targets.new_zeros((lp.shape[0], 0))
    return tok[:, 0], rank, ids, vals


@dataclass(frozen=True)
class LogprobBuffers:
    """Static outputs of the processed decode graphs, K steps x B rows (runtime device):
    token [K, B] float32 (log-probability of the drawn token), rank [K, B] int32,
    top_ids [K, B, N] int64 and top_vals [K, B, N] float32 (N = width, descending)."""

    token: torch.Tensor
    rank: torch.Tensor
    top_ids: torch.Tensor
    top_vals: torch.Tensor

    @classmethod
    def allocate(cls, *, steps: int, max_batch: int, width: int, device) -> "LogprobBuffers":
        k, b = steps, max_batch
        return cls(torch.zeros((k, b), dtype=torch.float32, device=device),
                   torch.zeros((k, b), dtype=torch.int32, device=device),
                   torch.zeros((k, b, width), dtype=torch.int64, device=device),
                   torch.zeros((k, b, width), dtype=torch.float32, device=device))

    @property
    def width(self) -> int:
        return self.top_ids.shape[2]

    def record(self, step: int, size: int, logp_source: torch.Tensor, tokens: torch.Tensor) -> None:
        """Step `step`'s rows [0, size): logp_source [size, V], tokens [size] int64 drawn."""
        tok, rank, ids, vals = token_logprobs(logp_source, tokens, self.width)
        self.token[step, :size].copy_(tok)
        self.rank[step, :size].copy_(rank)
        self.top_ids[step, :size].copy_(ids)
        self.top_vals[step, :size].copy_(vals)

    def view(self, n: int) -> tuple[torch.Tensor, ...]:
        """(token [K, n], rank [K, n], top_ids [K, n, N], top_vals [K, n, N]) views."""
        return self.token[:, :n], self.rank[:, :n], self.top_ids[:, :n], self.top_vals[:, :n]


class PromptLogprobs:
    """Collects prompt log-probabilities chunk by chunk during a prefill (eager).

    prompts: the prefill's [T_i] int64 prompts; want: {row i: n alternatives} for the rows that
    asked. `__call__(i, start, logits)` takes row i's logits [n, V] float32 of positions start ..
    start + n - 1 (each predicts the next prompt token; the last position's is skipped).
    `result(i)` -> (logprob [T_i - 1], rank [T_i - 1], top ids [T_i - 1, n], top logprobs) on CPU,
    for prompt tokens 1 .. T_i - 1."""

    def __init__(self, prompts: list[torch.Tensor], want: dict[int, int]):
        self.prompts, self.want = prompts, dict(want)
        self._parts: dict[int, list] = {i: [] for i in want}

    def __call__(self, i: int, start: int, logits: torch.Tensor) -> None:
        p = self.prompts[i]
        stop = min(start + logits.shape[0], p.numel() - 1)     # positions with a next prompt token
        if stop <= start:
            return
        targets = p[start + 1: stop + 1].to(logits.device)
        self._parts[i].append(token_logprobs(logits[: stop - start], targets, self.want[i]))

    def result(self, i: int):
        parts = self._parts[i]
        if not parts:
            n = self.want[i]
            return (torch.zeros(0), torch.zeros(0, dtype=torch.int32), torch.zeros((0, n), dtype=torch.int64),
                    torch.zeros((0, n)))
        return tuple(torch.cat([p[j] for p in parts]).cpu() for j in range(4))


__all__ = ["LogprobBuffers", "PromptLogprobs", "token_logprobs"]
