"""The tensor-parallel executor: the Executor protocol (graphrt/worker/protocol.py) over ranks.

    ex = TPExecutor(local, ctx.control, health=group.failure)   # rank 0's LocalExecutor
    ex.caps                 # rank 0's capabilities less what tensor parallelism cannot do
    ex.run(Block(n, draw=Draw(sampled=True)))   # broadcast, then run on every rank
    follow(local, ctx.control, runtime=local.runtime)            # ranks 1..n-1 (driver.py)

Every call that changes device state (capture, prefill, run: each launch with the slot changes
it carries, applied by every rank's own input batch) is broadcast by the TPDriver (driver.py)
and run by every rank's LocalExecutor; queries of host state
(prefill_graphed, the error flag, check_device_errors) are answered by rank 0's alone: every rank
runs the same inputs, so its guards see what the others' see.

What tensor parallelism cannot do yet is declared in `caps`, not discovered: no speculative
decoding, no logits processing or log-probabilities, no prompt chunks inside decode blocks
(TP_LIMITS). A launch that asks for one is refused with a ValueError naming the field, before
anything is broadcast; `check_config` refuses an engine configuration asking for one before
any rank is spawned.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from graphrt.parallel.driver import TPDriver
from graphrt.worker.caps import Capabilities
from graphrt.worker.launch import Block, Prefill, Result

# EngineConfig fields tensor parallelism does not support -> the value it runs with
TP_LIMITS = {"speculative": None, "mixed_prefill_tokens": 0}


def check_config(config, world_size: int) -> None:
    """ValueError naming the first EngineConfig field (TP_LIMITS) that world_size > 1 ranks
    cannot run."""
    if world_size == 1:
        return
    for name, value in TP_LIMITS.items():
        got = getattr(config, name)
        if got != value:
            raise ValueError(f"{name}: not with tensor_parallel > 1 (got tensor_parallel={world_size}, "
                             f"{name}={got!r}); use tensor_parallel=1 or {name}={value!r}")


class TPExecutor:
    """local: rank 0's LocalExecutor (graphrt/worker/local.py); control: the gloo control group;
    health: WorkerGroup.failure (a dead rank makes the next call raise RankError)."""

    def __init__(self, local, control, *, health=None):
        self.local = local
        self.runtime = local.runtime                  # rank 0's ModelRuntime (tools, tests)
        self.driver = TPDriver(local, control, runtime=local.runtime, health=health)

    @property
    def caps(self) -> Capabilities:
        c = self.local.caps
        tp = self.runtime.model.tp
        return replace(c, speculative=None, spec_ks=(), spec_rounds=0, processing=False,
                       logprobs_width=0, structured=False, mixed_tokens=0, draft_state=False,
                       tensor_parallel=1 if tp is None else tp.world_size)

    @property
    def error_flag(self) -> torch.Tensor:
        """Rank 0's sticky device-guard flags ([1] int32, device)."""
        return self.local.error_flag

    def capture(self) -> dict:
        return self.driver.call("capture")

    def stage_chunk(self, slot: int, tokens: torch.Tensor, start: int, *, table_row=None) -> None:
        self.caps.refuse("mixed_tokens", False, "prompt chunks inside decode blocks are not supported "
                                                "with tensor parallelism")

    def write_token_mask(self, slots: list[int], bits: torch.Tensor, active: torch.Tensor) -> None:
        self.caps.refuse("structured_outputs", False, "constrained decoding (it needs logits processing) "
                                                      "is not supported with tensor parallelism")

    def prefill(self, launch: Prefill) -> Result:
        caps = self.caps
        caps.refuse("processing", launch.processing is None, "logits processing is not supported with "
                                                             "tensor parallelism")
        caps.refuse("prompt_logprobs", not launch.prompt_logprobs, "not supported with tensor parallelism")
        return self.driver.call("prefill", launch)

    def run(self, block: Block) -> Result:
        caps = self.caps
        caps.refuse("k", block.k == 0, f"speculative blocks (k={block.k}) are not supported with tensor parallelism")
        caps.refuse("chunk", not block.chunk, "prompt chunks inside decode blocks are not supported with "
                                              "tensor parallelism")
        caps.refuse("processed", not block.draw.processed, "logits processing is not supported with "
                                                           "tensor parallelism")
        return self.driver.call("run", block)

    def prefill_graphed(self, new_tokens: int) -> bool:
        return self.local.prefill_graphed(new_tokens)

    def measure_costs(self):
        return None                                   # no speculation: nothing to weigh

    def check_device_errors(self) -> None:
        self.local.check_device_errors()

    def shutdown(self) -> None:
        """Ends the workers' `follow` loops (WorkerGroup.close calls it)."""
        self.driver.shutdown()


__all__ = ["TPExecutor", "TP_LIMITS", "check_config"]
