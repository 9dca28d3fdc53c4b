"""parallel/executor.py: what tensor parallelism cannot do is declared in TPExecutor's capabilities
and refused by name before anything is broadcast (a launch, an engine config); the protocol is
implemented without forwarding (no __getattr__). No process is started here: the refusals come
before the driver's first broadcast (test_tp.py runs the executor over real ranks)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from graphrt.config import RuntimeConfig
from graphrt.engine.config import EngineConfig
from graphrt.parallel.executor import TPExecutor, check_config
from graphrt.speculative.config import SpeculativeConfig
from graphrt.worker.caps import Capabilities
from graphrt.worker.launch import Block, Draw, Prefill
from graphrt.worker.protocol import Executor


def _tp_executor():
    config = RuntimeConfig(num_qo_heads=2, num_kv_heads=2, head_dim=64, page_size=4, max_context_len=64,
                           buckets={"max": 2}, dtype="float32", backend="reference")
    caps = Capabilities(config=config, device=torch.device("cpu"), num_pages=9, vocab_size=50, model_key="m",
                        steps_per_graph=2, speculative=SpeculativeConfig(method="ngram", num_tokens=2),
                        spec_ks=(1, 2), spec_rounds=2, processing=True, logprobs_width=5, mixed_tokens=8,
                        history_width=64, draft_state=True)
    runtime = SimpleNamespace(model=SimpleNamespace(tp=SimpleNamespace(world_size=2)))
    local = SimpleNamespace(caps=caps, runtime=runtime, error_flag=torch.zeros(1, dtype=torch.int32))
    return TPExecutor(local, control=None)


def test_the_tp_executor_declares_what_it_lacks():
    ex = _tp_executor()
    assert isinstance(ex, Executor)
    c = ex.caps
    assert c.tensor_parallel == 2 and c.speculative is None and c.spec_ks == () and not c.processing
    assert c.logprobs_width == 0 and c.mixed_tokens == 0 and not c.draft_state
    assert c.steps_per_graph == 2 and c.num_pages == 9                 # rank 0's, unchanged


@pytest.mark.parametrize("block,field", [
    (Block(2, k=2), "k"),
    (Block(2, chunk=True), "chunk"),
    (Block(2, draw=Draw(sampled=True, processed=True)), "processed"),
])
def test_launches_tp_cannot_run_are_refused_naming_the_field(block, field):
    with pytest.raises(ValueError, match=rf"^{field}: .*\(tensor_parallel=2\)$"):
        _tp_executor().run(block)


def test_prefills_and_chunks_tp_cannot_run_are_refused_naming_the_field():
    ex = _tp_executor()
    table = torch.zeros((1, 4), dtype=torch.int32)
    from graphrt.model.sampling import SamplingInputs
    inputs = SamplingInputs(torch.zeros(1), torch.zeros(1, dtype=torch.int32), torch.ones(1),
                            torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^prompt_logprobs: "):
        ex.prefill(Prefill([torch.tensor([1, 2])], table, slots=[0], sampling=inputs, prompt_logprobs={0: 1}))
    with pytest.raises(ValueError, match=r"^mixed_tokens: "):
        ex.stage_chunk(0, torch.tensor([1, 2]), 0)
    assert not ex.caps.structured
    with pytest.raises(ValueError, match=r"^structured_outputs: .*\(tensor_parallel=2\)$"):
        ex.write_token_mask([0], torch.zeros((1, 2), dtype=torch.int32), torch.ones(1, dtype=torch.int32))


@pytest.mark.parametrize("kw,field", [
    (dict(speculative={"method": "ngram", "num_tokens": 2}), "speculative"),
    (dict(mixed_prefill_tokens=16), "mixed_prefill_tokens"),
])
def test_engine_configs_tp_cannot_run_are_refused_naming_the_field(kw, field):
    check_config(EngineConfig(**kw), 1)                               # one rank: anything goes
    with pytest.raises(ValueError, match=rf"^{field}: not with tensor_parallel > 1"):
        check_config(EngineConfig(**kw), 2)
    check_config(EngineConfig(), 2)
