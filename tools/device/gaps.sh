#!/usr/bin/env bash
# One H200 call: the no-host-sync speculation test, the logits-processing GPU tests, and
# tools/device/engine_gaps.py (graph step vs engine per token, device idle gaps, host syncs).
#   bash .device/bootstrap.sh bash tools/device/gaps.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; L=/tmp/gaps; rm -rf "$L"; mkdir -p "$L" "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$SECONDS; S="$OUT/summary.txt"
pack() { tar czf "$OUT/gaps.tgz" -C /tmp gaps; }
t() { local name=$1 lim=$2; shift 2
  timeout "$lim" python -m pytest -m gpu -q -s -rfEs --tb=short -p no:cacheprovider "$@" > "$L/$name.log" 2>&1
  echo "$name rc=$? at $((SECONDS - T0)) s: $(grep -E "passed|failed" "$L/$name.log" | tail -1)" | tee -a "$S"
  grep -E "^(FAILED|ERROR)" "$L/$name.log" | head -6 | tee -a "$S"; pack; }
timeout 200 python tools/device/engine_gaps.py --out "$L/engine_gaps.json" --configs none:1,none:4,ngram:1 \
  > "$L/engine_gaps.log" 2>&1; echo "engine_gaps rc=$? at $((SECONDS - T0)) s" | tee -a "$S"
rm -f "$L"/trace_*.json; pack
t spec 90 "tests/engine/test_speculative_gpu.py::test_spec_block_launch_and_admission_make_no_host_sync"
t sampling 170 tests/kernels/test_logits_process.py tests/engine/test_sampling_extras_gpu.py
python - "$L/engine_gaps.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    t = r["timeline"]
    print(r["spec"], r["bs"], "engine", round(r["engine_us_per_token"]), "step", round(r.get("step_us", 0)),
          "x", round(r.get("engine_x_step", 0), 2), "busy", round(t.get("busy", 0), 2),
          "gaps", t.get("gaps_over_20us"), round(t.get("gap_sum_us", 0)), round(t.get("largest_gap_us", 0)))
    print("  gap by call:", t.get("gap_us_by_call_inside")); print("  syncs:", r.get("syncs")); print("  sync us:", t.get("sync_call_us"))
PY
cat "$S"
