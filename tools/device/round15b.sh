#!/usr/bin/env bash
# Second H200 call of round 15 (~8 min): what K costs in TTFT where a step is long. The 8B shape
# through `graphrt serve` (tools/bench_serve.py): device-planned K = 4, device-planned K = 1, K = 4
# with prompts carried by the decode blocks (mixed_prefill_tokens 256) and host-planned K = 1,
# side by side at 2 and 8 clients (mixed prompts 32-1024 tokens, 128 new).
# Then LLM() start-up on the 1B shape with fused GEMVs off (the default now), after a priming run.
# Bounded by DEADLINE (s). $OUT/round15b.tgz.
#   DEADLINE=480 bash .device/bootstrap.sh bash tools/device/round15b.sh
NAME=round15b; . tools/device/lib.sh
export PYTHONPYCACHEPREFIX=/tmp/pyc
timeout $(cap 330) python tools/bench_serve.py --make llama-3.1-8b --make-dir /tmp/ck8b --device cuda \
  --variants graphrt,graphrt-k1,graphrt-mixed,graphrt-hostplan --concurrency 2,8 --requests 3 --time-budget-s 20 \
  --out-dir "$L" --name bench_serve_k_h200 > "$L/bench_serve.log" 2>&1
say "bench_serve rc=$?"
grep -E "^\| graphrt" "$L/bench_serve.log" | cut -c1-220 | tee -a "$S"; pack
CK=/tmp/ck1b
timeout 60 python tools/make_checkpoint.py $CK --shape llama-3.2-1b --device cuda > "$L/make_ckpt.log" 2>&1
for m in prime plain; do
  t0=$(date +%s.%N); timeout $(cap 100) python tools/device/startup_llm.py $CK $t0 plain > "$L/llm_$m.log" 2>&1
  say "LLM $m rc=$?: $(grep -E "^ready" "$L/llm_$m.log")"
done
grep -E "startup: ready" "$L/llm_plain.log" | cut -c1-500 | tee -a "$S"
pack; cat "$S"
