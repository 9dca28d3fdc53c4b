#!/usr/bin/env bash
# A/B of the decode step on the H200: tools/profile_step.py per-kernel tables for AB items
# "splitk:backend:model:weights[:kv:batch:context]" (GRAPHRT_SPLITK = splitk), each bounded by
# AB_S seconds, JSON under $OUT/step_ab, one line per item in $OUT/step_ab/summary.txt.
#   AB="1:flashinfer:llama-3.1-8b:bf16 auto:triton-decode:llama-3.1-8b:bf16" bash tools/device/step_ab.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; L="$OUT/step_ab"; mkdir -p "$L"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
for item in ${AB:-}; do
  IFS=: read -r sk be m w kv bs ctx <<< "$item"
  f="$L/ab_${m}_${w}_${be}_s${sk}_${kv:-auto}_bs${bs:-1}_${ctx:-1024}.json"
  GRAPHRT_SPLITK=$sk timeout ${AB_S:-40} python tools/profile_step.py --model "$m" --weights "$w" --backend "$be" \
    --kv "${kv:-auto}" --batch "${bs:-1}" --context "${ctx:-1024}" --out "$f" 2>&1 | grep -v "^  \|Warn" | tee -a "$L/summary.txt"
done
python - "$L" <<'PY'
import json, sys, glob
for f in sorted(glob.glob(sys.argv[1] + "/ab_*.json")):
    r = json.load(open(f))
    fam = " ".join(f"{k}={v:.0f}/{r['families_launches'][k]:.0f}" for k, v in
                   sorted(r["families_us"].items(), key=lambda kv: -kv[1]))
    print(f"{r['model'][6:]:<7} {r['weights']:<15} {r.get('backend'):<13} splitk={r.get('splitk')} kv={r.get('kv')} "
          f"bs{r['batch']} {r['device_us_per_step']:6.0f}us {fam}")
PY
