#!/usr/bin/env bash
# The round's last H200 call (~9 min): GPU tests of every path changed this round (decode attention
# over bf16 / FP8 pages, the FP8 KV cache, graph caches, the host-planning fallback), per-layer decode
# attention at the new defaults, the 8B step with bf16 / FP8 KV side by side, and the graph cache of
# a model: graphrt-capture --model on a Llama-3.2-1B-shape checkpoint, then two fresh processes
# loading through graphrt serve's load path with --graph-cache (Triton compiles counted, the
# cache's files hashed before and after). Bounded by DEADLINE (s, default 540). $OUT/final12.tgz.
#   DEADLINE=540 bash .device/bootstrap.sh bash tools/device/final12.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; L=/tmp/final12; rm -rf "$L"; mkdir -p "$L" "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$SECONDS; S="$OUT/summary.txt"
cap() { local l=$((${DEADLINE:-540} - (SECONDS - T0))); [ "$1" -lt "$l" ] && echo "$1" || echo $((l > 5 ? l : 5)); }
pack() { tar czf "$OUT/final12.tgz" -C /tmp final12; }
say() { echo "$1 at $((SECONDS - T0)) s" | tee -a "$S"; }
CK=/tmp/ck1b; GC=/tmp/gc1b
( timeout 60 python tools/make_checkpoint.py $CK --shape llama-3.2-1b --device cuda > "$L/make_ckpt.log" 2>&1 ) &
MK=$!
timeout $(cap ${TEST_S:-200}) python -m pytest -m gpu -q -rfEs --tb=short -p no:cacheprovider --timeout 150 \
  tests/attention/test_decode_attention_gpu.py tests/attention/test_fp8_kv_gpu.py tests/model/test_fp8_kv.py \
  tests/cache tests/model/test_fallback_gpu.py ${EXTRA_TESTS:-} > "$L/tests.log" 2>&1
say "tests rc=$?: $(grep -E "passed|failed" "$L/tests.log" | tail -1)"; grep -E "^(FAILED|ERROR)" "$L/tests.log" | cut -c1-300 | tee -a "$S"; pack
timeout $(cap 70) python tools/bench_step_parts.py --parts decode --batches 1,16 --contexts 1024,8192 \
  --decode-kernels triton-decode --decode-splits 3 --out "$L/bench_decode.json" > "$L/bench_decode.log" 2>&1
say "bench_step_parts decode rc=$?"; pack
timeout $(cap 60) python tools/bench_e2e.py --models llama-3.1-8b --batches 16 --contexts 8192 \
  --variants graphrt-k4,graphrt-td-k4 --kv bf16,fp8 --weights bf16 --no-prefill --steps 16 \
  --out "$L/bench_e2e_bs16_8k.json" > "$L/bench_e2e.log" 2>&1; say "bench_e2e bs16/8k rc=$?"; pack
wait $MK; say "make_checkpoint: $(tail -1 "$L/make_ckpt.log")"
timeout $(cap 150) graphrt-capture --model $CK --out $GC --max-num-seqs 16 --max-model-len 4096 > "$L/capture_model.log" 2>&1
say "graphrt-capture --model rc=$?: $(ls $GC 2>/dev/null | wc -l) entries"
find $GC -type f -exec sha256sum {} + 2>/dev/null | sort -k2 > "$L/gc_before.txt"
for i in 1 2; do
  t0=$(date +%s.%N)
  timeout $(cap 60) python - $CK $GC $t0 > "$L/warm_$i.log" 2>&1 <<'PY'
import logging, sys, time
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
from graphrt.serve.cli import build_parser, load
a = build_parser().parse_args(["--model", sys.argv[1], "--graph-cache", sys.argv[2], "--max-num-seqs", "16",
                               "--max-model-len", "4096", "--stats-interval", "0"])
llm, _ = load(a)
ready = time.time() - float(sys.argv[3])
from graphrt.engine.params import SamplingParams
out = llm.generate([[5, 6, 7, 8]], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
print(f"ready {ready:.2f} s after process start; first request {time.time() - float(sys.argv[3]) - ready:.2f} s; "
      f"tokens {out[0].outputs[0].token_ids}")
llm.shutdown()
PY
  say "warm start $i rc=$?: $(grep -E "^ready" "$L/warm_$i.log")"
done
find $GC -type f -exec sha256sum {} + 2>/dev/null | sort -k2 > "$L/gc_after.txt"
cmp -s "$L/gc_before.txt" "$L/gc_after.txt" && say "graph cache unchanged ($(wc -l < "$L/gc_after.txt") files)" \
  || say "GRAPH CACHE CHANGED: $(diff "$L/gc_before.txt" "$L/gc_after.txt" | head -5 | tr '\n' ';')"
pack
tail -25 "$L/tests.log" | cut -c1-300
grep "shape\|^[18]b " "$L/bench_decode.log" | tail -20
grep -v "Warning\|^ *$\|^{\|INFO" "$L/bench_e2e.log" | tail -6
tail -8 "$L/capture_model.log"; grep -iE "start-up|startup|kernel|compiled|graph cache|ready" "$L/warm_2.log" | tail -12
cat "$S"
