#!/usr/bin/env bash
# One GPU call (~8 min warm): the speculative engine GPU tests (EAGLE-3: the drafter's warm-up of
# every chain-step MAX_SPLITS runs at their capture; draft / n-gram / EAGLE-3 with prefix caching
# and chunked prefill, on by default under speculation since 6c1266c), then two measurements
# that choose the next changes.
#  1. the multi-query (verify / prefill-chunk) attention kernel per layer at Q = 1 and Q = 5 over
#     split counts, bs 1 / 4 / 16, 1k / 8k (tools/bench_step_parts.py --parts attention): whether
#     default_splits' choice (at most one split per 4 key blocks; 3 at bs 16) should change;
#  2. where a repeated 4k prefix's time to first token goes, step by step (tools/trace_arrival.py
#     --workload reuse on a random Llama-3.2-1B-shape checkpoint, overlapped then synced).
#   DEADLINE=540 bash .device/bootstrap.sh bash tools/device/probe_verify_ttft.sh      (carry .device)
NAME=probe_verify_ttft; DEADLINE=${DEADLINE:-540}; . tools/device/lib.sh   # logs, pack, cap, say
timeout $(cap 300) python -m pytest -m gpu -q -s -rfEs --tb=short -p no:cacheprovider \
  tests/speculative/test_eagle3_gpu.py tests/engine/test_speculative_eagle3_gpu.py \
  tests/engine/test_speculative_gpu.py > "$L/eagle3_tests.log" 2>&1
say "speculative GPU tests rc=$?: $(grep -E "passed|failed" "$L/eagle3_tests.log" | tail -1)"; pack
timeout $(cap 200) python tools/bench_step_parts.py --parts attention --attn-q 1,5 --batches 1,4,16 \
  --contexts 1024,8192 --attn-splits 1,2,4,8,16,32,64 --out "$L/attention_splits.json" \
  > "$L/attention_splits.log" 2>&1; say "attention splits rc=$?"; pack
timeout $(cap 200) python tools/trace_arrival.py --make llama-3.2-1b --workload reuse --streams 0 --long-len 4096 \
  --chunk 2048 --sync --out "$L/trace_reuse.json" > "$L/trace_reuse.log" 2>&1; say "trace reuse rc=$?"; pack
grep -E "\*:" "$L/attention_splits.log" | head -40 | tee -a "$S"
grep -A12 "^## " "$L/trace_reuse.log" | tee -a "$S"
cat "$S"
