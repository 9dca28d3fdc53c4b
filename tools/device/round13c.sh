#!/usr/bin/env bash
# Third H200 call of round 13 (~6 min): start-up with Python's bytecode cached (PYTHONPYCACHEPREFIX,
# primed once, as on an installed machine): LLM() ready time split (tools/device/startup_llm.py, plain
# and with transformers imported on a thread), -X importtime; python -m capture --model and two warm
# starts through serve's load path with --graph-cache; bench_prefix arrival rows at three stalls;
# the graph-cache GPU tests. Bounded by DEADLINE (s). $OUT/round13c.tgz.
NAME=round13c; . tools/device/lib.sh
export PYTHONPYCACHEPREFIX=/tmp/pyc
CK=/tmp/ck1b; GC=/tmp/gc1b
timeout 60 python tools/make_checkpoint.py $CK --shape llama-3.2-1b --device cuda > "$L/make_ckpt.log" 2>&1
for m in prime plain bg plain; do
  t0=$(date +%s.%N); timeout $(cap 120) python tools/device/startup_llm.py $CK $t0 ${m/prime/plain} > "$L/llm_$m.log" 2>&1
  say "LLM $m rc=$?: $(grep -E "^ready" "$L/llm_$m.log")"
done
grep -E "startup: ready" "$L/llm_plain.log" | cut -c1-400 | tee -a "$S"
t0=$(date +%s.%N); timeout $(cap 60) python -X importtime tools/device/startup_llm.py $CK $t0 plain > "$L/llm_imp.log" 2> "$L/importtime.txt"
pack
timeout $(cap 120) python -m capture --model $CK --out $GC --max-num-seqs 16 --max-model-len 8192 > "$L/capture_model.log" 2>&1
say "capture --model rc=$?"
find $GC -type f -exec sha256sum {} + 2>/dev/null | sort -k2 > "$L/gc_before.txt"
for i in 1 2; do
  t0=$(date +%s.%N)
  timeout $(cap 60) python tools/device/serve_load.py $CK $GC $t0 > "$L/warm_$i.log" 2>&1
  say "serve load warm $i rc=$?: $(grep -E "^ready" "$L/warm_$i.log")"
done
find $GC -type f -exec sha256sum {} + 2>/dev/null | sort -k2 > "$L/gc_after.txt"
cmp -s "$L/gc_before.txt" "$L/gc_after.txt" && say "graph cache unchanged ($(wc -l < "$L/gc_after.txt") files)" \
  || say "GRAPH CACHE CHANGED"
pack
timeout $(cap 120) python tools/bench_prefix.py --model $CK --device cuda --out-dir "$L" --stalls 0.25,0.5,1 \
  --name bench_prefix_stalls_h200 > "$L/bench_prefix.log" 2>&1
say "bench_prefix rc=$?"; pack
timeout $(cap 150) python -m pytest -m gpu -q -rfEs --tb=short -p no:cacheprovider tests/cache > "$L/tests.log" 2>&1
say "tests/cache gpu rc=$?: $(grep -E "passed|failed" "$L/tests.log" | tail -1)"; grep -E "^(FAILED|ERROR)" "$L/tests.log" | cut -c1-300 | tee -a "$S"; pack
grep -E "^ *[0-9]+ graphrt" "$L/warm_2.log" | cut -c1-300 | head -14
grep -E "^\|" "$L/bench_prefix.log" | cut -c1-250
python - "$L/importtime.txt" <<'PY'
import sys
rows = []
for line in open(sys.argv[1]):
    if not line.startswith("import time:") or "self [us]" in line:
        continue
    parts = line.split("|")
    name = parts[2]
    rows.append((int(parts[1]), len(name) - len(name.lstrip()), name.strip()))
for c, i, n in sorted([r for r in rows if r[1] <= 3], reverse=True)[:22]:
    print(f"{c / 1e6:7.3f} s  {'.' * i}{n}")
PY
cat "$S"
