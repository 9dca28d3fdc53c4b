#!/usr/bin/env bash
# The round's last H200 call (under ~6.5 min): every GPU path changed this round, most
# important first, each bounded by the call's deadline (DEADLINE_S, default 390 s):
#   reliability + speculation GPU tests; W8A8 / FP8 GPU tests; EAGLE-3 GPU tests; fused logits
#   processing (GPU tests, then tools/bench_sampling.py); tools/device/profile_engine.py.
# Everything in $OUT/round_final.tgz; one line per part in $OUT/summary.txt.
#   bash .device/bootstrap.sh bash tools/device/round_final.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; L=/tmp/round_final; rm -rf "$L"; mkdir -p "$L" "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$SECONDS; END=${DEADLINE_S:-390}; S="$OUT/summary.txt"
pack() { tar czf "$OUT/round_final.tgz" -C /tmp round_final; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$L/gpu.txt" 2>&1
CK=/tmp/ck8b_l4
( python tools/make_checkpoint.py "$CK" --shape llama-3.1-8b --layers 4 > "$L/make_ck.log" 2>&1 ) &
MK=$!
TO=""; python -c "import pytest_timeout" 2>/dev/null && TO=1
lim() { local left=$(( END - (SECONDS - T0) )); [ "$1" -gt "$left" ] && echo "$left" || echo "$1"; }
part() {  # part NAME SECONDS pytest-args...
  local name=$1 t; t=$(lim "$2"); shift 2
  if [ "$t" -lt 20 ]; then echo "$name: skipped (out of time)" | tee -a "$S"; return; fi
  timeout "$t" python -m pytest -m gpu -q -s -rfEs --tb=short -p no:cacheprovider ${TO:+--timeout "$t"} "$@" \
    > "$L/$name.log" 2>&1
  echo "$name rc=$? at $((SECONDS - T0)) s: $(grep -E "passed|failed" "$L/$name.log" | tail -1)" | tee -a "$S"
  grep -E "^(FAILED|ERROR)" "$L/$name.log" | head -6 | tee -a "$S"; pack
}
part rel 150 tests/engine/test_loader_poison.py \
  "tests/engine/test_engine_gpu.py::test_no_host_sync_inside_a_sampled_block" tests/engine/test_speculative_gpu.py
part fp8 70 tests/model/test_fp8_gpu.py
part eagle3 70 tests/engine/test_speculative_eagle3_gpu.py
part sampling 120 tests/kernels/test_logits_process.py tests/engine/test_sampling_extras_gpu.py
wait $MK
t=$(lim 60)
if [ "$t" -ge 20 ]; then
  timeout "$t" python tools/bench_sampling.py "$CK" --batches 1,16 --tokens 96 --k 4 --out "$L/bench_sampling.json" \
    > "$L/bench_sampling.log" 2>&1; echo "bench_sampling rc=$? at $((SECONDS - T0)) s" | tee -a "$S"; pack
fi
t=$(lim 90)
if [ "$t" -ge 25 ]; then
  timeout "$t" python tools/device/profile_engine.py --out "$L/profile_engine.txt" > "$L/profile_engine.log" 2>&1
  echo "profile_engine rc=$? at $((SECONDS - T0)) s" | tee -a "$S"
fi
pack
tail -5 "$L/bench_sampling.log"; grep "===\|threaded" "$L/profile_engine.log"
cat "$S"
