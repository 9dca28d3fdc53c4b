"""A pure-Python executor of the protocol with logits processing and token masks, for the
engine's constrained-decoding tests (test_structured_blocks.py, test_free_run.py): it draws a
constrained slot's token as the allowed token (its last written mask) of the highest
pseudo-random score, and any other slot's as its current token + 1."""
from __future__ import annotations

import torch

from graphrt.config import RuntimeConfig
from graphrt.kernels.token_mask import reference_mask
from graphrt.worker.caps import Capabilities
from graphrt.worker.launch import Block, Prefill, Result

K, B = 3, 4


class MaskingExecutor:
    """The Executor protocol, no device: `calls` records ("prefill" | "run" | "mask", launch or slots)."""

    def __init__(self, vocab: int):
        config = RuntimeConfig(num_qo_heads=2, num_kv_heads=2, head_dim=64, page_size=4, max_context_len=128,
                               buckets={"max": B}, dtype="float32", backend="reference")
        self.caps = Capabilities(config=config, device=torch.device("cpu"), num_pages=96, vocab_size=vocab,
                                 model_key="fake", steps_per_graph=K, processing=True, structured=True)
        self.error_flag, self.vocab, self.calls = None, vocab, []
        self.current, self.length = [0] * B, [0] * B
        self.bits = torch.full((B, (vocab + 31) // 32), -1, dtype=torch.int32)
        self.active = torch.zeros(B, dtype=torch.int32)
        self.forward: int | None = None                 # n of a split step's forward, until its draw
        self.dropped = 0                                # forwards never drawn (a forward advances no slot)

    def _draw(self, slot: int) -> int:
        score = ((torch.arange(self.vocab) * 7919 + self.length[slot] * 104729) % 1009).float()
        score = reference_mask(score[None], self.bits, self.active, torch.tensor([slot]))[0]
        tok = int(score.argmax()) if int(self.active[slot]) else (self.current[slot] + 1) % self.vocab
        self.current[slot], self.length[slot] = tok, self.length[slot] + 1
        return tok

    def capture(self) -> dict:
        return {}

    def stage_chunk(self, slot, tokens, start, *, table_row=None) -> None:
        raise AssertionError("caps.mixed_tokens is 0")

    def prefill(self, launch: Prefill) -> Result:
        self.calls.append(("prefill", launch))
        if self.forward is not None:                    # a forward launched ahead: dropped (its draw
            self.forward, self.dropped = None, self.dropped + 1   # after this would fail below)
        if not launch.draws:
            return Result(None)
        for slot, j in zip(launch.slots, launch.sources or range(len(launch.slots))):
            self.length[slot] = (launch.starts[j] if launch.starts else 0) + launch.prompts[j].numel()
        return Result(torch.tensor([[self._draw(s) for s in launch.slots]]))

    def run(self, block: Block) -> Result:
        self.calls.append(("run", block))
        assert block.k == 0 and not block.chunk
        if block.part == "forward":
            assert block.draw.processed
            self.dropped += self.forward is not None
            self.forward = block.n
            return Result(None)
        if block.part == "draw":
            assert self.forward == block.n, "a draw without its forward"
            self.forward = None
            return Result(torch.tensor([[self._draw(s) for s in range(block.n)]]))
        assert self.forward is None
        out = torch.tensor([[self._draw(s) for s in range(block.n)] for _ in range(K)])
        return Result(out)

    def write_token_mask(self, slots, bits, active) -> None:
        self.calls.append(("mask", list(slots)))
        idx = torch.tensor(slots, dtype=torch.long)
        self.bits.index_copy_(0, idx, bits)
        self.active.index_copy_(0, idx, active)

    def prefill_graphed(self, new_tokens: int) -> bool:
        return False

    def measure_costs(self):
        return None

    def check_device_errors(self) -> None:
        pass
