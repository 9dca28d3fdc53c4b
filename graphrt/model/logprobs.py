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

from graphrt.kernels.ops import KernelOps, default_ops


def token_logprobs(logp_source: torch.Tensor, targets: torch.Tensor, width: int, *, ops: KernelOps | None = None):
    """logp_source [R, V] float, targets [R] int64 -> (logprob [R] float32, rank [R] int32,
    top ids [R, width] int64, top logprobs [R, width] float32; descending, ties to the lowest
    id). Fused chunked passes (kernels/logits_process.py; ops: the kernel set, None: Triton's).
    Capturable (no sync)."""
    r, dev = logp_source.shape[0], logp_source.device
    out = (torch.empty(r, dtype=torch.float32, device=dev), torch.empty(r, dtype=torch.int32, device=dev),
           torch.empty((r, width), dtype=torch.int64, device=dev), torch.empty((r, width), dtype=torch.float32, device=dev))
    default_ops(ops).logprobs_into(logp_source.contiguous(), targets.contiguous(), *out)
    return out


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

    def rows(self, step: int, size: int) -> tuple[torch.Tensor, ...]:
        """Step `step`'s rows [0, size): (token [size], rank [size], top_ids [size, N], top_vals
        [size, N]) views, the outputs a fused processed step writes (ProcessState.draw)."""
        return self.token[step, :size], self.rank[step, :size], self.top_ids[step, :size], self.top_vals[step, :size]

    def record(self, step: int, size: int, logp_source: torch.Tensor, tokens: torch.Tensor, *,
               ops: KernelOps | None = None) -> None:
        """Step `step`'s rows [0, size): logp_source [size, V], tokens [size] int64 drawn (ops:
        the kernel set, None: Triton's)."""
        default_ops(ops).logprobs_into(logp_source.contiguous(), tokens.contiguous(), *self.rows(step, size))

    def view(self, n: int) -> tuple[torch.Tensor, ...]:
        """(token [K, n], rank [K, n], top_ids [K, n, N], top_vals [K, n, N]) views."""
        return self.token[:, :n], self.rank[:, :n], self.top_ids[:, :n], self.top_vals[:, :n]


class PromptLogprobs:
    """Collects prompt log-probabilities chunk by chunk during a prefill (eager).

    prompts: the prefill's [T_i] int64 prompts; want: {row i: n alternatives} for the rows that
    asked. `__call__(i, start, logits)` takes row i's logits [n, V] float32 of positions start ..
    start + n - 1 (each predicts the next prompt token; the last position's is skipped).
    `result(i)` -> (logprob [T_i - 1], rank [T_i - 1], top ids [T_i - 1, n], top logprobs) on CPU,
    for prompt tokens 1 .. T_i - 1. ops: the kernel set (None: Triton's)."""

    def __init__(self, prompts: list[torch.Tensor], want: dict[int, int], *, ops: KernelOps | None = None):
        self.prompts, self.want, self.ops = prompts, dict(want), ops
        self._parts: dict[int, list] = {i: [] for i in want}

    def __call__(self, i: int, start: int, logits: torch.Tensor) -> None:
        p = self.prompts[i]
        stop = min(start + logits.shape[0], p.numel() - 1)     # positions with a next prompt token
        if stop <= start:
            return
        targets = p[start + 1: stop + 1].to(logits.device)
        self._parts[i].append(token_logprobs(logits[: stop - start], targets, self.want[i], ops=self.ops))

    def result(self, i: int):
        parts = self._parts[i]
        if not parts:
            n = self.want[i]
            return (torch.zeros(0), torch.zeros(0, dtype=torch.int32), torch.zeros((0, n), dtype=torch.int64),
                    torch.zeros((0, n)))
        return tuple(torch.cat([p[j] for p in parts]).cpu() for j in range(4))


__all__ = ["LogprobBuffers", "PromptLogprobs", "token_logprobs"]
