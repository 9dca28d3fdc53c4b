"""kernels/token_mask.py against its torch rule written independently here (bit t % 32 of word
t // 32), with fresh random masks, inactive rows untouched, a slot map, and bad arguments."""
import pytest
import torch

from graphrt.kernels.token_mask import apply_token_mask, words


def _expected(logits, bits, active, slots):
    out = logits.clone()
    for r in range(logits.shape[0]):
        s = r if slots is None else int(slots[r])
        if not active[s]:
            continue
        for t in range(logits.shape[1]):
            if not (int(bits[s, t // 32]) >> (t % 32)) & 1:
                out[r, t] = float("-inf")
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("use_slots", [False, True])
def test_matches_rule(dtype, use_slots):
    g = torch.Generator().manual_seed(3)
    v, b = 1100, 5                                        # V not a multiple of 32 nor of the chunk
    bits = torch.randint(-2**31, 2**31 - 1, (b, words(v)), generator=g, dtype=torch.int64).to(torch.int32)
    active = torch.tensor([1, 0, 1, 1, 0], dtype=torch.int32)
    slots = torch.tensor([4, 2, 0], dtype=torch.long) if use_slots else None
    r = 3 if use_slots else b
    logits = torch.randn(r, v, generator=g).to(dtype)
    want = _expected(logits, bits, active, slots)
    got = apply_token_mask(logits.clone(), bits, active, slots)
    assert torch.equal(got, want)
    if not use_slots:
        assert torch.equal(got[1], logits[1]) and torch.equal(got[4], logits[4])   # inactive: untouched


def test_bad_arguments():
    logits = torch.zeros(2, 64)
    bits, active = torch.zeros(2, 2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="bits"):
        apply_token_mask(logits, bits[:, :1], active)
    with pytest.raises(ValueError, match="bits"):
        apply_token_mask(logits, bits.to(torch.int64), active)
    with pytest.raises(ValueError, match="active"):
        apply_token_mask(logits, bits, active[:1])
    with pytest.raises(ValueError, match="slots"):
        apply_token_mask(logits, bits, active, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="logits"):
        apply_token_mask(torch.zeros(3, 64), bits, active)
