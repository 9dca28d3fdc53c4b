#!/usr/bin/env bash
# One H200 call for the step at the floor: FlashInfer's JIT warmed in the background, the step's
# pieces alone (tools/bench_step_parts.py: split-K GEMMs by a view, decode attention kernels),
# and tools/profile_step.py per-kernel tables (PROFILES: "model:weights:backend:kv:batch:context"
# items), then GPU tests (TESTS, bounded by TEST_S) and EXTRA (a command). Every part is bounded by DEADLINE (s, default 540). Logs and JSON under $OUT.
#   DEADLINE=540 bash .device/bootstrap.sh bash tools/device/step_round.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; L="$OUT/step_round"; mkdir -p "$L"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$SECONDS; S="$L/summary.txt"
cap() { local l=$((${DEADLINE:-540} - (SECONDS - T0))); [ "$1" -lt "$l" ] && echo "$1" || echo $((l > 5 ? l : 5)); }
say() { echo "$1 at $((SECONDS - T0)) s" | tee -a "$S"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$S"
( timeout 240 python tools/device/jit_warm.py --head-dims 64,128 --kv ${JIT_KV:-bf16,fp8} > "$L/jit_warm.log" 2>&1 ) &
JIT=$!
if [ -n "${PARTS:-gemm,attention}" ]; then
  timeout $(cap ${PARTS_S:-120}) python tools/bench_step_parts.py --parts "${PARTS:-gemm,attention}" ${PARTS_ARGS:-} \
    --out "$L/bench_step_parts.json" > "$L/bench_step_parts.log" 2>&1; say "bench_step_parts rc=$?"
fi
wait $JIT; say "jit_warm: $(tr '\n' ';' < "$L/jit_warm.log" | tail -c 200)"
for p in ${PROFILES:-llama-3.1-8b:bf16:flashinfer:auto:1:1024}; do
  IFS=: read -r m w b kv bs ctx <<< "$p"
  timeout $(cap 60) python tools/profile_step.py --model "$m" --weights "$w" --backend "$b" --kv "$kv" --batch "$bs" \
    --context "$ctx" --out "$L/profile_${m}_${w}_${b}_${kv}_bs${bs}_${ctx}.json" >> "$L/profile_step.log" 2>&1
  say "profile $p rc=$?"
done
if [ -n "${TESTS:-}" ]; then
  timeout $(cap ${TEST_S:-200}) python -m pytest -m gpu -q -rfEs --tb=short -p no:cacheprovider $TESTS > "$L/tests.log" 2>&1
  say "tests rc=$?: $(grep -E "passed|failed" "$L/tests.log" | tail -1)"
  grep -E "^(FAILED|ERROR)" "$L/tests.log" | cut -c1-300 | tee -a "$S"
fi
[ -n "${EXTRA:-}" ] && { timeout $(cap ${EXTRA_S:-120}) bash -c "$EXTRA" > "$L/extra.log" 2>&1; say "extra rc=$?"; }
grep -v "^  \|Warning" "$L/profile_step.log" 2>/dev/null
python - "$L" <<'PY'
import json, sys, glob
for f in sorted(glob.glob(sys.argv[1] + "/profile_*.json")):
    r = json.load(open(f))
    fam = " ".join(f"{k}={v:.0f}/{r['families_launches'][k]:.0f}" for k, v in
                   sorted(r["families_us"].items(), key=lambda kv: -kv[1]))
    print(f"{r['model'][6:]:<7} {r['weights']:<15} {r.get('backend')} kv={r.get('kv')} bs{r['batch']} {r['device_us_per_step']:6.0f}us {fam}")
PY
cat "$L/bench_step_parts.log" 2>/dev/null | grep -v Warning | head -250
cat "$S"
