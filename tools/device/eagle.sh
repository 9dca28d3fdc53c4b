#!/usr/bin/env bash
# EAGLE-3 heads on one H200 (< 4 min): the head's GPU tests; train the tiny family (target + draft);
# train an EAGLE-3 head for the target; offline acceptance length at k = 4 on held-out completion
# (head vs the family's draft model); a random head in the Llama-3.1-8B shape in the public layout
# loads and its step / draft-extend / round run as CUDA graphs, timed vs the weight-bytes floor.
#   bash .device/bootstrap.sh bash tools/device/eagle.sh
# Models go to $EAGLE_DIR (default /tmp/eagle, never under $OUT); logs and JSON to $OUT.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
DIR="${EAGLE_DIR:-/tmp/eagle}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
t0=$(date +%s); rc=0
step() { echo "== $1: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/eagle.log"; }

step "gpu tests"
timeout 60 python -m pytest -m gpu -q -rs -p no:cacheprovider tests/speculative/test_eagle3_gpu.py 2>&1 \
  | tee "$OUT/pytest_eagle.log" | tail -5 || rc=1

step "train_tiny (draft, target)"
rm -rf "$DIR"
timeout 120 python tools/train_tiny.py --out "$DIR" --models draft,target --time-budget-s draft=8,target=55 2>&1 \
  | grep -v "Writing model shards" | tee "$OUT/train_tiny.log" | tail -6 || rc=1
cp "$DIR/train.json" "$OUT/train_tiny.json" 2>/dev/null

step "train_eagle3"
timeout 110 python tools/train_eagle3.py --target "$DIR/target" --out "$DIR/eagle3" --time-budget-s 40 \
  --eval-prompts 0 2>&1 | grep -v "Loading weights" | tee "$OUT/train_eagle3.log" | tail -8 || rc=1
cp "$DIR/eagle3/train_eagle3.json" "$OUT/" 2>/dev/null; cp "$DIR/eagle3/config.json" "$OUT/eagle3_config.json" 2>/dev/null

step "acceptance (k = 4, held-out completion)"
timeout 120 python tools/eagle3_accept.py --target "$DIR/target" --head "$DIR/eagle3" --draft "$DIR/draft" \
  --k 4 --prompts 10 --prompt-tokens 128 --new-tokens 128 --json "$OUT/accept_k4.json" 2>&1 \
  | grep -v "Loading weights" | tee "$OUT/accept.log" | tail -6 || rc=1

step "8B-shape head step"
timeout 90 python tools/bench_eagle3_step.py --batch 1,4 --context 1024 --k 4 --json "$OUT/bench_eagle3_step.json" 2>&1 \
  | tee "$OUT/bench_eagle3_step.log" | tail -12 || rc=1
step "done (rc=$rc)"
exit $rc
