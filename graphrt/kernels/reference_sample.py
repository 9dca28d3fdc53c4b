"""The torch references of the drawing kernels: sample.py, logits_process.py, token_mask.py.

As kernels/reference.py for the layer kernels, one implementation serving two uses: the kernel
tests compare each Triton kernel (interpreted on a CPU) with the function of the same name here,
and the "torch" kernel set (kernels/ops.py, a CPU's default) draws with these, so a CPU runs no
Triton. Same signatures, in-place outputs and argument checks as the kernels (the checks live
here and the Triton wrappers call them).

Rules, as the kernels state them:
- sampling (kernels/sample.py): temperature, top-k, then top-p over the renormalised top-k mass on
  the stably sorted logits; Gumbel-max over the kept tokens with kernels/philox.py's noise, which
  is Triton's Philox bit for bit, so the same scores draw the same token; ties to the lowest id.
- processing (kernels/logits_process.py): repetition, presence, frequency penalties, the live
  token rules summed per id and added, min_p at the row's temperature; then the unsorted draw,
  log-probabilities (v - max) - log(sum exp(v - max)), ranks, top-W ordered by value with ties to
  the lowest id (the kernels' int64 keys), the drawn token counted.
- masks (kernels/token_mask.py): bit t % 32 of word t // 32; a disallowed token of an active row
  becomes -inf.
Float sums (top-p mass, log-softmax normaliser) are whole-row torch sums where the kernels sum
chunk-wise: a float32 rounding apart. Eager, as the rest of the torch set: the draws read on the
host which rows sample and how long their kept prefixes are, so the Philox noise is drawn only
where a token can be drawn (a greedy batch draws none). This module imports no Triton.
"""
from __future__ import annotations

import torch

from graphrt.kernels.philox import gumbel_score

BIG = 2 ** 62                                   # above every token id (the lowest-id tie rule)
_KMIN = -(2 ** 63) + 1                          # below every top-W key


# ---- argument checks (the Triton wrappers call these too) ---------------------------------------
def check_sample_args(logits, temperature, top_k, top_p, seed, step, out, *, advance: bool,
                      rows_per_slot) -> int:
    """sample_tokens' contract; returns Q = rows_per_slot. ValueError naming the argument."""
    q = rows_per_slot
    if isinstance(q, bool) or not isinstance(q, int) or q < 1:
        raise ValueError(f"rows_per_slot: must be an int >= 1, got {q!r}")
    if q > 1 and advance:
        raise ValueError("rows_per_slot: a verify's draws (Q > 1) do not advance step")
    n = logits.shape[0]
    if n % q:
        raise ValueError(f"rows_per_slot: {q} does not divide the {n} logits rows")
    for name, t, m in (("temperature", temperature, n // q), ("top_k", top_k, n // q), ("top_p", top_p, n // q),
                       ("seed", seed, n // q), ("step", step, n // q), ("out", out, n)):
        if t.dim() != 1 or t.shape[0] != m or not t.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous [{m}] tensor, got "
                             f"{tuple(t.shape)} strides {t.stride()}")
    return q


def check_rows(r: int, **tensors) -> None:
    """Each tensor has r rows, contiguous along the vocabulary (1-D: contiguous)."""
    for name, t in tensors.items():
        if t.shape[0] != r or (t.dim() == 1 and not t.is_contiguous()) or (t.dim() == 2 and t.stride(1) != 1):
            raise ValueError(f"{name}: expected {r} rows, contiguous along the vocabulary, got "
                             f"{tuple(t.shape)} strides {t.stride()}")


def check_state(counts, prompt, params, rule_ids, rule_vals, rule_until, bias) -> None:
    """The processing state's layout (model/processing.py ProcessState)."""
    if params.stride(1) != 1 or counts.stride(1) != 1 or prompt.stride(1) != 1 or not rule_ids.is_contiguous() \
            or not rule_vals.is_contiguous() or not rule_until.is_contiguous() or not bias.is_contiguous():
        raise ValueError("process: params / counts / prompt / rule tables / bias must be contiguous rows")


def check_source(source: str) -> None:
    if source not in ("raw", "processed"):
        raise ValueError(f"source: expected 'raw' or 'processed', got {source!r}")


def words(vocab: int) -> int:
    """Mask words (int32) per row for a vocabulary of `vocab` ids: ceil(vocab / 32)."""
    return (vocab + 31) // 32


def check_mask_args(logits, bits, active, slots) -> None:
    """apply_token_mask's contract. ValueError naming the argument."""
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"logits: expected [R, V] contiguous along V, got {tuple(logits.shape)} "
                         f"strides {logits.stride()}")
    r, v = logits.shape
    if bits.dim() != 2 or bits.dtype != torch.int32 or bits.shape[1] < words(v) or bits.stride(1) != 1:
        raise ValueError(f"bits: expected [B, >= {words(v)}] int32 contiguous, got {tuple(bits.shape)} "
                         f"{bits.dtype}")
    if active.dim() != 1 or active.dtype != torch.int32 or active.shape[0] != bits.shape[0]:
        raise ValueError(f"active: expected [{bits.shape[0]}] int32, got {tuple(active.shape)} {active.dtype}")
    if slots is None and r > bits.shape[0]:
        raise ValueError(f"logits: {r} rows, the mask has {bits.shape[0]} (pass slots)")
    if slots is not None and (slots.dim() != 1 or slots.shape[0] != r or (r and slots.stride(0) != 1)):
        raise ValueError(f"slots: expected [{r}] contiguous, got {tuple(slots.shape)} strides {slots.stride()}")
    for name, t in (("bits", bits), ("active", active), ("slots", slots)):
        if t is not None and t.device != logits.device:
            raise ValueError(f"{name}: on {t.device}, expected the logits' device {logits.device}")


# ---- sampling (kernels/sample.py) -----------------------------------------------------------
def _safe(temperature: torch.Tensor) -> torch.Tensor:
    return torch.where(temperature > 0, temperature, torch.ones_like(temperature))


def _kept(x: torch.Tensor, top: torch.Tensor, safe_t: torch.Tensor, top_k: torch.Tensor,
          top_p: torch.Tensor) -> torch.Tensor:
    """Kept prefix length [R] int64 of sorted float32 x [R, V]: top_k (<= 0 or > V: V), then the
    smallest prefix whose mass of the renormalised top-k distribution reaches top_p (< 1)."""
    v = x.shape[1]
    k = top_k.to(torch.int64)
    k = torch.where((k <= 0) | (k > v), v, k)
    inside = torch.arange(v, device=x.device)[None, :] < k[:, None]
    e = torch.where(inside, torch.exp((x - top[:, None]) / safe_t[:, None]), 0.0)
    keep = ((e.cumsum(1) - e) < (top_p * e.sum(1))[:, None]) & inside
    return torch.where(top_p < 1.0, keep.sum(1), k)


def _gumbel_pick(x, tok, inside, top, safe_t, seed, t, sampled) -> torch.Tensor:
    """Gumbel-max over the `inside` entries of float32 x [R, N] with token ids tok [R, N] (or [N])
    in the `sampled` [R] rows: the lowest id of the best score; BIG where a row has none or is not
    sampled. The noise is drawn for the sampled rows only (a host read of which: the torch set
    runs eagerly), so a greedy batch costs no Philox pass."""
    rows = sampled.nonzero()[:, 0]
    pick = torch.full_like(top, BIG, dtype=torch.int64)
    if rows.numel() == 0:
        return pick
    x, inside, top, safe_t, seed, t = (a.index_select(0, rows) for a in (x, inside, top, safe_t, seed, t))
    tok = tok.index_select(0, rows) if tok.dim() == 2 else tok
    score = gumbel_score(x, top[:, None], safe_t[:, None], seed[:, None], t[:, None], tok)
    score = torch.where(inside, score, float("-inf"))
    best = score.max(1, keepdim=True).values
    tok = tok.expand_as(score)
    return pick.index_copy_(0, rows, torch.where((score == best) & inside, tok, BIG).min(1).values)


def sample_tokens(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                  top_p: torch.Tensor, seed: torch.Tensor, step: torch.Tensor,
                  out: torch.Tensor, *, advance: bool = True, filtered: bool = True,
                  rows_per_slot: int = 1) -> None:
    """kernels/sample.py's sample_tokens: one token per row of logits [N, V] into out [N] int64;
    row r reads slot r // Q's temperature / top_k / top_p / seed at draw index step[slot] + r % Q
    (Q = rows_per_slot); with `advance`, step += 1. filtered=False: top_k / top_p not read."""
    q = check_sample_args(logits, temperature, top_k, top_p, seed, step, out, advance=advance,
                          rows_per_slot=rows_per_slot)
    n, v = logits.shape
    if n == 0:
        return
    dev = logits.device
    r = torch.arange(n, device=dev)
    slot = r // q
    temp = temperature.index_select(0, slot)
    t = step.index_select(0, slot).to(torch.int64) + r % q
    safe_t = _safe(temp)
    cols = torch.arange(v, device=dev)
    sampled = temp > 0
    if filtered:
        vals, idx = torch.sort(logits, dim=-1, descending=True, stable=True)     # [N, V] each
        x = vals.float()
        top, best = x[:, 0], idx[:, 0]
        m = _kept(x, top, safe_t, top_k.index_select(0, slot), top_p.index_select(0, slot))
        scan = max(1, int(torch.where(sampled, m, 0).max()))   # the longest kept prefix drawn from
        x, tok, inside = x[:, :scan], idx[:, :scan], cols[None, :scan] < m[:, None]   # (a host read)
    else:
        x = logits.float()
        top, best = x.max(1).values, torch.argmax(logits, dim=-1)
        tok, inside = cols, torch.ones_like(x, dtype=torch.bool)
    pick = _gumbel_pick(x, tok, inside, top, safe_t, seed.index_select(0, slot), t, sampled)
    out.copy_(torch.where(sampled & (pick < BIG), pick, best))
    if advance:
        step.copy_(t + 1)


def kept_lengths(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                 top_p: torch.Tensor):
    """kernels/sample.py's kept_lengths: (order [R, V] int64, the ids by descending logit
    (stable), kept [R] int32, the kept prefix length; V for greedy rows)."""
    v = logits.shape[1]
    vals, idx = torch.sort(logits, dim=-1, descending=True, stable=True)
    x = vals.float()
    m = _kept(x, x[:, 0], _safe(temperature), top_k, top_p) if v else torch.zeros_like(top_k, dtype=torch.int64)
    return idx, torch.where(temperature > 0, m, v).to(torch.int32)


# ---- logits processing, draw and log-probabilities (kernels/logits_process.py) ---------------
def _processed(logits, counts, prompt, params, rule_ids, rule_vals, rule_until, step, temperature, slots):
    """The processing rule -> (x [R, V] float32 after min_p, the row maxima before it [R])."""
    r, v = logits.shape
    if slots is not None:
        sl = slots.to(torch.int64)
        counts, prompt, params = counts.index_select(0, sl), prompt.index_select(0, sl), params.index_select(1, sl)
        rule_ids, rule_vals, rule_until = (t.index_select(0, sl) for t in (rule_ids, rule_vals, rule_until))
    else:
        counts, prompt, params = counts[:r], prompt[:r], params[:, :r]
        rule_ids, rule_vals, rule_until = rule_ids[:r], rule_vals[:r], rule_until[:r]
    x = logits.float()
    seen = counts > 0
    rep = params[2][:, None]
    y = torch.where(seen | prompt, torch.where(x > 0, x / rep, x * rep), x)
    y = y - params[0][:, None] * seen.to(torch.float32)
    y = y - params[1][:, None] * counts.to(torch.float32)
    live = (rule_ids >= 0) & (rule_ids < v) & (step[:, None] < rule_until)
    bias = torch.zeros((r, v), dtype=torch.float32, device=x.device)
    bias.scatter_add_(1, torch.where(live, rule_ids, 0), torch.where(live, rule_vals, 0.0))
    y = torch.where(bias != 0.0, y + bias, y)
    top = y.max(1).values
    min_p = params[3]
    cut = torch.where((min_p > 0) & (temperature > 0), torch.log(min_p.clamp_min(1e-30)), float("-inf"))
    y = torch.where((y - top[:, None]) / _safe(temperature)[:, None] < cut[:, None], float("-inf"), y)
    return y, top


def _key(v: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    """float32 v, int64 tok -> int64 keys ordered by v, then by the lower tok (the kernels')."""
    bits = v.contiguous().view(torch.int32)
    o = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (o.to(torch.int64) << 32) | (0xFFFFFFFF - tok)


def _unkey(k: torch.Tensor):
    o = (k >> 32).to(torch.int32)
    bits = o ^ ((o >> 31) & 0x7FFFFFFF)
    return bits.view(torch.float32), 0xFFFFFFFF - (k & 0xFFFFFFFF)


def _logprobs(src: torch.Tensor, tok: torch.Tensor, lp_token, lp_rank, lp_ids, lp_vals) -> None:
    """Log-probabilities of float32 src [R, V] at tok [R] into the four outputs (in place)."""
    r, v = src.shape
    mx = src.max(1, keepdim=True).values
    log_z = torch.log(torch.where(src != float("-inf"), torch.exp(src - mx), 0.0).sum(1, keepdim=True))
    lp = (src - mx) - log_z                                                   # [R, V]
    lp_tok = (src.gather(1, tok[:, None]) - mx) - log_z                       # [R, 1]
    lp_token.copy_(lp_tok[:, 0])
    lp_rank.copy_((lp > lp_tok).sum(1) + 1)
    w = lp_ids.shape[1]
    if w:
        keys = _key(src, torch.arange(v, device=src.device)[None, :])
        if w > v:                                          # empty slots: the kernels' _KMIN keys
            keys = torch.cat([keys, torch.full((r, w - v), _KMIN, dtype=torch.int64, device=src.device)], 1)
        val, ids = _unkey(keys.topk(w, dim=1).values)
        lp_ids.copy_(ids)
        lp_vals.copy_((val - mx) - log_z)


def process_logits(logits, counts, prompt, params, rule_ids, rule_vals, rule_until, bias, step, temperature,
                   *, slots=None, chunk: int | None = None) -> torch.Tensor:
    """kernels/logits_process.py's process_logits: logits [R, V] -> [R, V] float32 processed;
    row r reads state row slots[r] (None: row r). bias: the kernels' scratch (unused here, left
    zero); chunk: unused (a launch option)."""
    r, v = logits.shape
    if r == 0:
        return torch.empty((0, v), dtype=torch.float32, device=logits.device)
    check_rows(r, logits=logits, step=step, temperature=temperature)
    check_state(counts, prompt, params, rule_ids, rule_vals, rule_until, bias)
    return _processed(logits, counts, prompt, params, rule_ids, rule_vals, rule_until, step, temperature, slots)[0]


def process_draw(logits, counts, prompt, params, rule_ids, rule_vals, rule_until, bias, seed, step,
                 temperature, live, out, lp_token, lp_rank, lp_ids, lp_vals, *, source: str,
                 chunk: int | None = None) -> torch.Tensor:
    """kernels/logits_process.py's process_draw over rows [0, R) of the state: process, draw
    (greedy rows the lowest arg-max, sampled rows Gumbel-max at draw index step) into out, step
    += 1, log-probabilities of "raw" logits or "processed" x / T, counts[r, token] += live.
    Returns x [R, V] float32 (after min_p)."""
    r, v = logits.shape
    if r == 0:
        return torch.empty((0, v), dtype=torch.float32, device=logits.device)
    check_source(source)
    check_rows(r, temperature=temperature, seed=seed, live=live, out=out, lp_token=lp_token, lp_rank=lp_rank,
               lp_ids=lp_ids, lp_vals=lp_vals)
    check_rows(r, logits=logits, step=step, temperature=temperature)
    check_state(counts, prompt, params, rule_ids, rule_vals, rule_until, bias)
    x, top = _processed(logits, counts, prompt, params, rule_ids, rule_vals, rule_until, step, temperature, None)
    safe_t = _safe(temperature)
    cols = torch.arange(v, device=x.device)
    sampled = temperature > 0
    pick = _gumbel_pick(x, cols, torch.ones_like(x, dtype=torch.bool), top, safe_t, seed, step.to(torch.int64), sampled)
    tok = torch.where(sampled & (pick < BIG), pick, torch.argmax(x, dim=-1))
    src = logits.float() if source == "raw" else x / safe_t[:, None]
    _logprobs(src, tok, lp_token, lp_rank, lp_ids, lp_vals)
    out.copy_(tok)
    step.add_(1)
    counts[:r].scatter_add_(1, tok[:, None], live.to(counts.dtype)[:, None])
    return x


def logprobs_into(src, targets, lp_token, lp_rank, lp_ids, lp_vals, *, chunk: int | None = None) -> None:
    """kernels/logits_process.py's logprobs_into: log-probabilities of src [R, V] at targets [R]
    int64 into lp_token [R] float32, lp_rank [R] int32, lp_ids [R, W] int64, lp_vals [R, W]
    float32 (the top W, descending, ties to the lowest id)."""
    r = src.shape[0]
    if r == 0:
        return
    check_rows(r, src=src, targets=targets, lp_token=lp_token, lp_rank=lp_rank, lp_ids=lp_ids, lp_vals=lp_vals)
    _logprobs(src.float(), targets, lp_token, lp_rank, lp_ids, lp_vals)


# ---- allowed-token masks (kernels/token_mask.py) ---------------------------------------------
def reference_mask(logits: torch.Tensor, bits: torch.Tensor, active: torch.Tensor,
                   slots: torch.Tensor | None = None) -> torch.Tensor:
    """The mask rule as a new tensor: logits [R, V] with the disallowed tokens of active rows
    -inf (row r reads mask row slots[r], default r)."""
    r, v = logits.shape
    rows = torch.arange(r, device=logits.device) if slots is None else slots.to(torch.long)
    b = bits.index_select(0, rows)                                              # [R, W]
    tok = torch.arange(v, device=logits.device)
    allowed = ((b[:, tok // 32] >> (tok % 32)) & 1) != 0                        # [R, V]
    on = active.index_select(0, rows) != 0
    return logits.masked_fill(on[:, None] & ~allowed, float("-inf"))


def apply_token_mask(logits: torch.Tensor, bits: torch.Tensor, active: torch.Tensor,
                     slots: torch.Tensor | None = None) -> torch.Tensor:
    """kernels/token_mask.py's apply_token_mask: disallowed tokens of active rows -> -inf, in
    place; returns logits."""
    check_mask_args(logits, bits, active, slots)
    if logits.shape[0]:
        logits.copy_(reference_mask(logits, bits, active, slots))
    return logits


__all__ = ["sample_tokens", "kept_lengths", "process_logits", "process_draw", "logprobs_into", "apply_token_mask",
           "reference_mask", "words", "check_sample_args", "check_rows", "check_state", "check_source",
           "check_mask_args", "BIG"]
