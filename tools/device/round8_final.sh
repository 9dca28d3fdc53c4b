#!/usr/bin/env bash
# The round's last H200 call (~7.5 min): every GPU path changed this round, most important first,
# each bounded by the call's deadline (DEADLINE_S, default 450 s):
#   the prefill path (pinned non-blocking copies, host indptrs to FlashInfer's plan) through the
#   engine, speculation (draft / EAGLE-3) and FP8 KV GPU tests; the EAGLE-3 tile warm-up
#   (tools/device/eagle3_lengths.py: TTFT per prompt length, Triton compiles while serving);
#   engine_gaps.py on the 1B shape cut to 4 layers (prefill sync sites and host time).
# Everything in $OUT/round8.tgz; one line per part in $OUT/summary.txt.
#   bash .device/bootstrap.sh bash tools/device/round8_final.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; L=/tmp/round8; rm -rf "$L" /tmp/e3; mkdir -p "$L" "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$SECONDS; END=${DEADLINE_S:-450}; S="$OUT/summary.txt"
pack() { tar czf "$OUT/round8.tgz" -C /tmp round8; }
lim() { local left=$(( END - (SECONDS - T0) )); [ "$1" -gt "$left" ] && echo "$left" || echo "$1"; }
part() {  # part NAME SECONDS pytest-args...
  local name=$1 t; t=$(lim "$2"); shift 2
  if [ "$t" -lt 20 ]; then echo "$name: skipped (out of time)" | tee -a "$S"; return; fi
  timeout "$t" python -m pytest -m gpu -q -s -rfEs --tb=short -p no:cacheprovider --timeout "$t" "$@" \
    > "$L/$name.log" 2>&1
  echo "$name rc=$? at $((SECONDS - T0)) s: $(grep -E "passed|failed" "$L/$name.log" | tail -1)" | tee -a "$S"
  grep -E "^(FAILED|ERROR)|sync sites" "$L/$name.log" | head -6 | cut -c1-600 | tee -a "$S"; pack
}
part prefill 150 tests/kernels/test_transfer.py tests/model/test_prefill.py tests/engine/test_engine_core_gpu.py \
  tests/engine/test_engine_gpu.py tests/model/test_fallback_gpu.py
part spec 140 tests/engine/test_speculative_eagle3_gpu.py tests/speculative/test_eagle3_gpu.py \
  tests/engine/test_speculative_gpu.py
t=$(lim 130)
if [ "$t" -ge 60 ]; then
  timeout "$t" python tools/device/eagle3_lengths.py --dir /tmp/e3 --out "$L/eagle3_lengths.json" \
    --lengths 130,167,204,241 --tokens 48 > "$L/eagle3_lengths.log" 2>&1
  echo "eagle3_lengths rc=$? at $((SECONDS - T0)) s" | tee -a "$S"
  grep '"method"' "$L/eagle3_lengths.log" | cut -c1-130 | tee -a "$S"; pack
fi
t=$(lim 70)
if [ "$t" -ge 40 ]; then
  timeout "$t" python tools/device/engine_gaps.py --configs none:1 --tokens 96 --out "$L/engine_gaps.json" \
    > "$L/engine_gaps.log" 2>&1; echo "engine_gaps rc=$? at $((SECONDS - T0)) s" | tee -a "$S"
  rm -f "$L"/trace_*.json
  python - "$L/engine_gaps.json" <<'PY' 2>/dev/null | tee -a "$S"
import json, sys
for r in json.load(open(sys.argv[1])):
    print(r["spec"], r["bs"], "engine", round(r["engine_us_per_token"]), "step", round(r.get("step_us", 0)),
          "prefill_host_wall_us", round(r.get("prefill_host", {}).get("wall_us", 0)), r["phases"])
    for k, v in r.get("prefill_host", {}).get("host_sites", {}).items():
        print("  site", v, k)
    for k, v in r.get("syncs", {}).items():
        print("  sync", v, k[-200:])
PY
fi
t=$(lim 60)
[ "$t" -ge 30 ] && part fp8kv "$t" "tests/attention/test_fp8_kv_gpu.py::test_llm_fp8_kv_on_gpu"
pack; cat "$S"
