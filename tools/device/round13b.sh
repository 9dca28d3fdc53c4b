#!/usr/bin/env bash
# Second H200 call of round 13 (~7 min): a profile of a warm start through graphrt serve's load path
# with --graph-cache (python -m capture --model first; cProfile of the second process), the prefix /
# arrival benchmark with the prefill pacer (tools/bench_prefix.py: paced, chunk 2048, no limit) and
# the arrival timeline with the pacer on. Bounded by DEADLINE (s). $OUT/round13b.tgz.
#   DEADLINE=480 bash .device/bootstrap.sh bash tools/device/round13b.sh
NAME=round13b; . tools/device/lib.sh
CK=/tmp/ck1b; GC=/tmp/gc1b
timeout 60 python tools/make_checkpoint.py $CK --shape llama-3.2-1b --device cuda > "$L/make_ckpt.log" 2>&1
timeout $(cap 200) python tools/bench_prefix.py --make llama-3.2-1b --device cuda --out-dir "$L" \
  --name bench_prefix_paced_h200 > "$L/bench_prefix.log" 2>&1
say "bench_prefix rc=$?"; pack
timeout $(cap 60) python tools/trace_arrival.py --model $CK --chunk 2048 --out "$L/trace_paced.json" > "$L/trace_paced.log" 2>&1
say "trace_arrival paced rc=$?"; pack
t0=$SECONDS
timeout $(cap 150) python -m capture --model $CK --out $GC --max-num-seqs 16 --max-model-len 8192 > "$L/capture_model.log" 2>&1
say "capture --model rc=$? in $((SECONDS - t0)) s"
t0=$(date +%s.%N); timeout $(cap 60) python tools/device/serve_load.py $CK $GC $t0 > "$L/warm_plain.log" 2>&1
say "warm start rc=$?: $(grep -E "^ready" "$L/warm_plain.log")"
t0=$(date +%s.%N); timeout $(cap 90) python -m cProfile -o "$L/warm.prof" tools/device/serve_load.py $CK $GC $t0 > "$L/warm_prof.log" 2>&1
say "warm start under cProfile rc=$?: $(grep -E "^ready" "$L/warm_prof.log")"
python - "$L/warm.prof" > "$L/warm_prof.txt" 2>&1 <<'PY'
import pstats, sys
p = pstats.Stats(sys.argv[1]); p.sort_stats("cumulative").print_stats(70); p.sort_stats("tottime").print_stats(40)
PY
pack
grep -E "^\|" "$L/bench_prefix.log" | cut -c1-250
grep -E "^## " "$L/trace_paced.log" | cut -c1-300; grep -E "^\|" "$L/trace_paced.log" | head -14 | cut -c1-200
grep -E "^ *[0-9]+ graphrt" "$L/warm_plain.log" | cut -c1-250 | head -20
grep -E "cumtime|^ +[0-9]" "$L/warm_prof.txt" | head -60 | cut -c1-200
cat "$S"
