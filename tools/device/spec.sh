#!/usr/bin/env bash
# Speculative decoding on one GPU, parts 2 + 3 of tools/bench_spec.py (about 4-5 minutes):
#   1. the sampling / acceptance / speculative-sampling GPU tests (compiled kernels, ~30 s)
#   2. train the draft + target of the tiny family (tools/train_tiny.py --size full: draft 15 s,
#      target 85 s; the same size as tools/trained_family_check.sh, without target-qwen3)
#   3. tools/bench_spec.py --trained: none / ngram / draft through LLM(speculative=...), bs 1 and 4,
#      held-out and repeat-heavy workloads; the 8B PROJECTION from docs/results/bench_spec_h200.json
# Checkpoints go to $GRAPHRT_TRAINED_DIR (default /tmp/trained, never under $OUT; REUSE=1 keeps a
# trained one). $OUT gets: gpu.txt pytest_spec_gpu.log train.log train.json
#   bench_spec_trained.log bench_spec_trained.json bench_spec_trained.png
#   bash .device/bootstrap.sh bash tools/device/spec.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
DIR="${GRAPHRT_TRAINED_DIR:-/tmp/trained}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
t0=$(date +%s); rc=0
timeout 120 python -m pytest -m gpu -q -rs --timeout 100 -p no:cacheprovider \
  tests/model/test_sampling.py tests/speculative/test_spec_sampling.py tests/speculative/test_accept.py \
  2>&1 | tee "$OUT/pytest_spec_gpu.log" | tail -15
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
echo "gpu tests: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/pytest_spec_gpu.log"
if [ "${REUSE:-0}" = 1 ] && [ -f "$DIR/train.json" ] && [ -d "$DIR/draft" ]; then
  echo "reusing $DIR" | tee "$OUT/train.log"
else
  rm -rf "$DIR"
  timeout 200 python tools/train_tiny.py --out "$DIR" --size full --device cuda --models draft,target 2>&1 \
    | grep -v "Writing model shards" | tee "$OUT/train.log" | tail -6
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
cp "$DIR/train.json" "$OUT/" 2>/dev/null
echo "train: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/train.log"
left=$(( ${DEADLINE_S:-560} - ($(date +%s) - t0) ))
[ "$left" -gt 330 ] && left=330
if [ "$left" -lt 60 ]; then
  echo "bench: skipped (out of time)" | tee "$OUT/bench_spec_trained.log"; rc=1
else
  timeout "$left" python tools/bench_spec.py --trained "$DIR" --out "$OUT/bench_spec_trained.json" \
    --png "$OUT/bench_spec_trained.png" 2>&1 | grep -v "Loading weights" | tee "$OUT/bench_spec_trained.log" | tail -30
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
echo "total: $(( $(date +%s) - t0 )) s, rc=$rc" | tee -a "$OUT/bench_spec_trained.log"
exit $rc
