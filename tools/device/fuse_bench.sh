#!/usr/bin/env bash
# One H200 call (~4 min) for the fused-GEMV decode layer (graphrt/model/fuse.py, issue #29): GPU
# correctness of the fused GEMVs and of fused vs unfused decode graphs first, then side by side
# at the 1B and 8B shapes, bs 1 and 16, context 1024: tools/bench_e2e.py rows (device us per step,
# x floor, kernels per step) for graphrt-unfused (fuse off) and graphrt-fused (fuse on);
# tools/profile_step.py per-family tables (1B bs 1, on / off); tools/bench_step_parts.py --parts
# fuse (the capture-time measurement per layer and its decision). Bounded by DEADLINE (s,
# default 235). Logs and JSON in $OUT/fuse_bench.tgz; summary on stdout.
#   bash tools/device/fuse_bench.sh
NAME=fuse_bench; DEADLINE=${DEADLINE:-235}; . tools/device/lib.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$S"
timeout $(cap 70) python -m pytest -m gpu -q -x -rfE --tb=short -p no:cacheprovider \
  tests/model/test_fuse_gpu.py -k "not measured_plan" > "$L/tests.log" 2>&1
say "fuse GPU tests rc=$?: $(grep -E "passed|failed|error" "$L/tests.log" | tail -1)"
grep -E "^(FAILED|ERROR)" "$L/tests.log" | cut -c1-300 | tee -a "$S"; pack
timeout $(cap 110) python tools/bench_e2e.py --models llama-3.2-1b,llama-3.1-8b --batches 1,16 --contexts 1024 \
  --variants graphrt-unfused,graphrt-fused --no-prefill --steps 16 --count-kernels \
  --out "$L/bench_e2e_fuse.json" > "$L/bench_e2e_fuse.log" 2> "$L/bench_e2e_fuse.err"
say "bench_e2e rc=$?"; pack
for f in off on; do
  timeout $(cap 30) python tools/profile_step.py --model llama-3.2-1b --batch 1 --context 1024 --fuse $f \
    --out "$L/profile_1b_bs1_fuse_$f.json" >> "$L/profile_step.log" 2>&1
  say "profile_step 1b fuse=$f rc=$?"
done
pack
timeout $(cap 45) python tools/bench_step_parts.py --parts fuse --ms 1,16 --models llama-3.2-1b,llama-3.1-8b \
  --out "$L/bench_step_parts_fuse.json" > "$L/bench_step_parts_fuse.log" 2>&1
say "bench_step_parts fuse rc=$?"; pack
echo "---- bench_e2e (fused vs unfused)"; cat "$L/bench_e2e_fuse.log"; tail -3 "$L/bench_e2e_fuse.err"
echo "---- profile_step 1B bs 1"; grep -v "Warn" "$L/profile_step.log" | cut -c1-250
echo "---- capture-time measurement per layer"; grep "^fuse " "$L/bench_step_parts_fuse.log" | cut -c1-300
tail -2 "$L/bench_step_parts_fuse.log" | grep -i "error" | cut -c1-300
cat "$S"
