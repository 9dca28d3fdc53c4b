#!/usr/bin/env bash
# One H200 call over every GPU path of the merged tree (about 9.5 minutes):
#   background: train the tiny family's draft + target (tools/train_tiny.py --size full)
#   foreground: the GPU tests of engine, model, attention, speculative, kernels, serve-free
#   then: tools/bench_spec.py --trained (none / ngram / draft through LLM(speculative=...))
#   then: the trained-family quality gate (graphrt bf16 vs HF float32 and HF bf16)
# Logs tarred to $OUT/final_logs.tgz; the short table last.
#   bash .device/bootstrap.sh bash tools/device/final.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; L=/tmp/final_logs; mkdir -p "$OUT" "$L"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
DIR=/tmp/trained; t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$L/gpu.txt" 2>&1
( timeout 260 python tools/train_tiny.py --out "$DIR" --size full --device cuda --models draft,target \
    > "$L/train.log" 2>&1; echo "train rc=$? at $(( $(date +%s) - t0 )) s" >> "$L/train.log" ) &
TRAIN=$!
timeout 285 python -m pytest -m gpu -q -rs --timeout 120 --durations=15 -p no:cacheprovider \
  tests/engine tests/model tests/attention tests/speculative tests/kernels \
  > "$L/pytest_gpu.log" 2>&1
echo "gpu tests rc=$? at $(( $(date +%s) - t0 )) s" | tee -a "$L/summary.txt"
wait $TRAIN; tail -2 "$L/train.log" | tee -a "$L/summary.txt"
cp "$DIR/train.json" "$L/" 2>/dev/null
timeout 170 python tools/bench_spec.py --trained "$DIR" --out "$L/bench_spec_trained.json" \
  --png "$L/bench_spec_trained.png" > "$L/bench_spec_trained.log" 2>&1
echo "bench_spec rc=$? at $(( $(date +%s) - t0 )) s" | tee -a "$L/summary.txt"
left=$(( 565 - ($(date +%s) - t0) ))
if [ "$left" -gt 40 ]; then
  GRAPHRT_TRAINED_DIR=$DIR timeout "$left" python -m pytest -q -s -p no:cacheprovider -m gpu --timeout "$left" \
    tests/test_trained_models.py::test_trained_family_quality_gates > "$L/trained_gate.log" 2>&1
  echo "trained gate rc=$? at $(( $(date +%s) - t0 )) s" | tee -a "$L/summary.txt"
  grep -h "greedy gate\|ppl\|perplexity" "$L/trained_gate.log" | tail -6 >> "$L/summary.txt"
fi
tar -czf "$OUT/final_logs.tgz" -C /tmp final_logs
tail -25 "$L/pytest_gpu.log"; tail -25 "$L/bench_spec_trained.log"; cat "$L/summary.txt"
