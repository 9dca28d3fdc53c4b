#!/usr/bin/env bash
# The trained tiny family on one GPU: train the draft/target family (tools/train_tiny.py, ~4 min on an H200), then
# held-out perplexity / greedy agreement / draft agreement (tools/eval_ppl.py). Checkpoints go to
# $GRAPHRT_TRAINED_DIR (default /tmp/trained, never under $OUT); what comes back goes to $OUT (8 files):
#   train.log train.json loss_curves.png eval.log eval_target.json eval_target-qwen3.json eval_draft.json gpu.txt
#   bash .device/bootstrap.sh bash tools/device/trained.sh
# REUSE=1 skips training when $GRAPHRT_TRAINED_DIR already holds train.json. CPU smoke run:
#   OUT=/tmp/o GRAPHRT_TRAINED_DIR=/tmp/m SIZE=micro DEVICE=cpu TRAIN_ARGS="--steps 8" \
#   EVAL_ARGS="--max-files 2 --window 24 --decode-tokens 4 --prompts 1 --prompt-tokens 8 --gen-tokens 4" bash tools/device/trained.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
DIR="${GRAPHRT_TRAINED_DIR:-/tmp/trained}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
t0=$(date +%s)
rc=0
if [ "${REUSE:-0}" = 1 ] && [ -f "$DIR/train.json" ]; then
  echo "reusing $DIR" | tee "$OUT/train.log"
else
  rm -rf "$DIR"
  timeout 330 python tools/train_tiny.py --out "$DIR" --size "${SIZE:-full}" --device "${DEVICE:-cuda}" ${TRAIN_ARGS:-} 2>&1 \
    | grep -v "Writing model shards" | tee "$OUT/train.log" || rc=1
fi
cp "$DIR/train.json" "$OUT/" 2>/dev/null; cp "$DIR/loss_curves.png" "$OUT/" 2>/dev/null
echo "train: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/train.log"
: > "$OUT/eval.log"
n_left=3
for m in target target-qwen3 draft; do
  # the whole call stays under ${DEADLINE_S:-530} s: what is left, less 45 s for each later eval
  # (the first eval also compiles FlashInfer's kernels: it needs the most)
  n_left=$((n_left - 1)); slot=$(( ${DEADLINE_S:-530} - ($(date +%s) - t0) - 45 * n_left ))
  [ "$slot" -gt 240 ] && slot=240
  [ "$slot" -lt 20 ] && { echo "eval $m: skipped (out of time)" | tee -a "$OUT/eval.log"; rc=1; continue; }
  [ -d "$DIR/$m" ] || { echo "missing $DIR/$m" | tee -a "$OUT/eval.log"; rc=1; continue; }
  extra=""
  [ "$m" = draft ] && extra="--prompts 0 --agree-with $DIR/target"
  t1=$(date +%s)
  timeout "$slot" python tools/eval_ppl.py "$DIR/$m" --device "${DEVICE:-cuda}" --json "$OUT/eval_$m.json" $extra ${EVAL_ARGS:-} 2>&1 \
    | grep -v "Loading weights" | tee -a "$OUT/eval.log" | tail -20
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  echo "eval $m: $(( $(date +%s) - t1 )) s" | tee -a "$OUT/eval.log"
done
python - "$OUT" <<'PY' 2>&1 | tee -a "$OUT/eval.log"
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
def load(m):
    f = out / f"eval_{m}.json"
    return json.loads(f.read_text()) if f.is_file() else None
print("quality gates:")
for m in ("target", "target-qwen3"):
    r = load(m)
    if r is None:
        print(f"  {m}: no eval JSON"); continue
    pr, dr = r["prefill_ratio"], r.get("decode", {}).get("ratio", float("nan"))
    g = r.get("greedy", {})
    print(f"  {m}: ppl prefill ratio {pr:.4f} [{'PASS' if abs(pr - 1) <= 0.01 else 'FAIL'}], decode ratio "
          f"{dr:.4f} [{'PASS' if abs(dr - 1) <= 0.01 else 'FAIL'}], greedy {g.get('identical')}/{g.get('prompts')} "
          f"max margin {g.get('max_margin_bf16_ulps', float('nan')):.2f} ulps "
          f"[{'PASS' if g.get('identical', 0) >= 58 and g.get('max_margin_bf16_ulps', 9) < 2 else 'FAIL'}]")
d = load("draft")
if d and "agree_with" in d:
    a = d["agree_with"]
    print(f"  draft: ppl {d['hf_fp32_ppl']:.3f} vs target {a['target_hf_fp32_ppl']:.3f}, ratio "
          f"{a['ppl_ratio_self_over_target']:.3f} [{'PASS' if a['ppl_ratio_self_over_target'] >= 1.5 else 'FAIL'}], "
          f"top-1 agreement {a['top1_agreement']:.4f}")
PY
echo "total: $(( $(date +%s) - t0 )) s, rc=$rc" | tee -a "$OUT/eval.log"
exit $rc
