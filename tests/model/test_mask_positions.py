"""model/token_mask.py's TokenMask with several positions a slot (constrained rows under
speculation): a write of [m, p, W] rows lands at positions [0, p) of its slots, a write of [m, W]
at position 0 only; a decode draw (apply) reads position 0, a verify (apply_verify) reads row
b * (k + 1) + j at slot b, position j; inactive slots are untouched; bad shapes name the field."""
from __future__ import annotations

import pytest
import torch

from graphrt.kernels.token_mask import reference_mask
from graphrt.model.token_mask import TokenMask

V, B, P = 70, 4, 3
W = (V + 31) // 32


def _bits(g, *shape):
    return torch.randint(-2**31, 2**31 - 1, (*shape, W), generator=g, dtype=torch.int64).to(torch.int32)


def test_positions_are_written_and_read_where_they_belong():
    g = torch.Generator().manual_seed(0)
    mask = TokenMask.allocate(B, V, "cpu", positions=P)
    rows = _bits(g, 2, P)
    mask.write([3, 1], rows, torch.tensor([1, 1], dtype=torch.int32))
    first = _bits(g, 1)
    mask.write([2], first, torch.tensor([1], dtype=torch.int32))                # position 0 only
    assert torch.equal(mask.bits[3], rows[0]) and torch.equal(mask.bits[1], rows[1])
    assert torch.equal(mask.bits[2, 0], first[0]) and (mask.bits[2, 1:] == -1).all()
    assert mask.active.tolist() == [[0] * P, [1] * P, [1] * P, [1] * P]
    logits = torch.randn(B, V, generator=g)
    got = mask.apply(logits.clone(), B)                                          # decode: position 0
    assert torch.equal(got, reference_mask(logits, mask.bits[:, 0], mask.active[:, 0]))
    assert torch.equal(got[0], logits[0])                                        # inactive: untouched
    sel = torch.tensor([3, 0])                                                   # a prefill's slots
    assert torch.equal(mask.apply(logits[:2].clone(), sel),
                       reference_mask(logits[:2], mask.bits[:, 0], mask.active[:, 0], sel))
    k = 1                                                                        # a verify of k + 1 rows a slot
    ver = torch.randn(B * (k + 1), V, generator=g)
    got = mask.apply_verify(ver.clone(), B, k)
    for b in range(B):
        for j in range(k + 1):
            want = reference_mask(ver[b * (k + 1) + j][None], mask.bits[b, j][None], mask.active[b, j][None])[0]
            assert torch.equal(got[b * (k + 1) + j], want), (b, j)


def test_bad_writes_and_positions_name_the_field():
    mask = TokenMask.allocate(B, V, "cpu", positions=P)
    one = torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^bits: expected \[1, 3\] or \[1, p <= 3, 3\]"):
        mask.write([0], torch.zeros((1, P + 1, W), dtype=torch.int32), one)
    with pytest.raises(ValueError, match=r"^bits:"):
        mask.write([0], torch.zeros((1, W + 1), dtype=torch.int32), one)
    with pytest.raises(ValueError, match=r"^active:"):
        mask.write([0], torch.zeros((1, W), dtype=torch.int32), torch.ones(2, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^k: 3 proposals need positions 4"):
        mask.apply_verify(torch.zeros(4 * B, V), B, 3)
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match=r"^positions:"):
            TokenMask.allocate(B, V, "cpu", positions=bad)


def test_the_host_knows_which_slots_are_constrained():
    """`on` follows what `write` set (flag 1 adds a slot, 0 removes it; a refused write changes
    nothing): `any_on` tells an eager draw whether it needs `apply`."""
    mask = TokenMask.allocate(B, V, "cpu", positions=P)
    bits = torch.zeros((2, W), dtype=torch.int32)
    assert not mask.any_on(range(B))
    mask.write([3, 1], bits, torch.tensor([1, 0], dtype=torch.int32))
    assert mask.on == {3} and mask.any_on([0, 3]) and not mask.any_on([0, 1, 2])
    mask.write([3], bits[:1], torch.tensor([0], dtype=torch.int32))
    assert not mask.any_on(range(B))
    with pytest.raises(ValueError, match="active"):
        mask.write([2], bits[:1], torch.ones(2, dtype=torch.int32))
    assert not mask.on and int(mask.active.sum()) == 0
