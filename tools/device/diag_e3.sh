#!/usr/bin/env bash
# One H200 call (~4 min): EAGLE-3 per prompt length (tools/device/eagle3_lengths.py) and
# engine_gaps.py over the same target with the head and with n-gram (host time per block phase).
#   bash .device/bootstrap.sh bash tools/device/diag_e3.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; L=/tmp/diag_e3; rm -rf "$L" /tmp/e3; mkdir -p "$L" "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$SECONDS; S="$OUT/summary.txt"
say() { echo "$1 at $((SECONDS - T0)) s" | tee -a "$S"; }
timeout 170 python tools/device/eagle3_lengths.py --dir /tmp/e3 --out "$L/lengths.json" > "$L/lengths.log" 2>&1
say "eagle3_lengths rc=$?"
H=$(ls -d /tmp/e3/head*/h 2>/dev/null | head -1); T=$(ls -d /tmp/e3/target* | head -1)
timeout 120 python tools/device/engine_gaps.py --model "$T" --configs "eagle3=$H:1,ngram:1" --tokens 128 \
  --out "$L/engine_gaps.json" > "$L/engine_gaps.log" 2>&1; say "engine_gaps rc=$?"
rm -f "$L"/trace_*.json; tar czf "$OUT/diag_e3.tgz" -C /tmp diag_e3
grep '"method"' "$L/lengths.log" | cut -c1-300; grep -A34 "Name" "$L/lengths.log" | cut -c1-160 | head -40
python - "$L/engine_gaps.json" <<'PY' 2>/dev/null
import json, sys
for r in json.load(open(sys.argv[1])):
    print(r["spec"][:8], r["bs"], "engine", round(r["engine_us_per_token"]), "step", round(r.get("step_us", 0)), r["phases"])
PY
cat "$S"
