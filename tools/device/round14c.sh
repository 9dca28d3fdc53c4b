#!/usr/bin/env bash
# Third H200 call of round 14 (~8 min): the fused-GEMV step (tools/device/fuse_bench.sh: GPU tests,
# bench_e2e fused vs unfused, profile_step, the capture-time choice), the garbage collector inside
# the prefill path with the start-up heap frozen and unfrozen (tools/device/prefill_host.py), and
# LLM() start-up without transformers (tools/device/startup_llm.py, first a priming run that
# compiles the kernels). $OUT/round14c.tgz and $OUT/fuse_bench.tgz.
#   bash .device/bootstrap.sh bash tools/device/round14c.sh
export PYTHONPYCACHEPREFIX=/tmp/pyc
DEADLINE=185 bash tools/device/fuse_bench.sh > /tmp/fuse_bench_stdout.log 2>&1
NAME=round14c; DEADLINE=140; . tools/device/lib.sh
cp /tmp/fuse_bench_stdout.log "$L/"
say "fuse_bench done"
CK=/tmp/ck1b
timeout 60 python tools/make_checkpoint.py $CK --shape llama-3.2-1b --device cuda > "$L/make_ckpt.log" 2>&1
for m in plain; do
  timeout $(cap 70) python tools/device/prefill_host.py $CK "$L/prefill_host_$m.json" $m > "$L/prefill_host_$m.log" 2>&1
  say "prefill_host $m rc=$?: $(grep -E "^== cold_first" "$L/prefill_host_$m.log")"
  grep -A40 "^== cold_first" "$L/prefill_host_$m.log" | grep -E "gc\.|==" | head -8 | tee -a "$S"
done
pack
for m in prime plain; do
  t0=$(date +%s.%N); timeout $(cap 100) python tools/device/startup_llm.py $CK $t0 ${m/prime/plain} > "$L/llm_$m.log" 2>&1
  say "LLM $m rc=$?: $(grep -E "^ready" "$L/llm_$m.log")"
done
grep -E "startup: ready" "$L/llm_plain.log" | cut -c1-500 | tee -a "$S"
pack
sed -n '/---- bench_e2e/,$p' /tmp/fuse_bench_stdout.log | cut -c1-260 | head -70
cat "$S"
