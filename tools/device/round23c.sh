#!/usr/bin/env bash
# One H100/H200 call (~5 min): the engine's GPU tests, then 8B TTFT at 8 clients with the step's prefill launches split (fewest
# new tokens first, each read back on its own: engine/blocks.py _prefill_launches), beside the engine
# before the change (AB=DIR: a mirror of the source files as they were) and the host-planned variant.
#   AB=.ab/round23 DEADLINE=300 bash .device/bootstrap.sh bash tools/device/round23c.sh   (carry .device, .whl, .ab)
NAME=round23c; DEADLINE=${DEADLINE:-300}; . tools/device/lib.sh   # logs, pack, cap, say
CK8=/tmp/ck8b; REQ=${REQ:-16}
( [ -f "$CK8/config.json" ] || timeout $(cap 120) python tools/make_checkpoint.py "$CK8" --shape llama-3.1-8b \
  --dtype bfloat16 --device cuda > "$L/make_ck8.log" 2>&1 ) &
MK=$!
# the engine's GPU tests (batched prompts: the split launches run there) while the checkpoint is written
timeout $(cap ${TESTS_S:-100}) python -m pytest -m gpu -q -rfEs --tb=short -p no:cacheprovider --timeout 90 \
  tests/engine/test_engine_gpu.py > "$L/gpu_engine.log" 2>&1
say "engine GPU tests rc=$?: $(grep -E "passed|failed|error" "$L/gpu_engine.log" | tail -1)"
grep -E "^(FAILED|ERROR)" "$L/gpu_engine.log" | cut -c1-250 | tee -a "$S"
wait $MK; say "checkpoint rc=$?"
if [ -n "${AB:-}" ]; then
  rm -rf /tmp/before && mkdir -p /tmp/before && cp -r graphrt tools /tmp/before/ && cp -r "$AB"/. /tmp/before/
  (cd /tmp/before && PYTHONPATH="$(echo "$PYTHONPATH" | sed "s#$OLDPWD#/tmp/before#")" timeout $(cap 100) \
     python tools/bench_serve.py --model "$CK8" --device cuda --variants graphrt --concurrency 8 --requests $REQ \
     --no-step-time --out-dir "$L" --name serve8c_before > "$L/serve8c_before.log" 2>&1)
  say "bench_serve before rc=$?"; grep -E "^\| graphrt" "$L/serve8c_before.log" | cut -c1-200 | tee -a "$S"; pack
fi
timeout $(cap 180) python tools/bench_serve.py --model "$CK8" --device cuda --variants graphrt,graphrt-hostplan \
  --concurrency 8 --requests $REQ --no-step-time --out-dir "$L" --name serve8c_after > "$L/serve8c_after.log" 2>&1
say "bench_serve after rc=$?"; grep -E "^\| graphrt" "$L/serve8c_after.log" | cut -c1-200 | tee -a "$S"; pack
cat "$S"
