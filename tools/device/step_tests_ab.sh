#!/usr/bin/env bash
# One GPU call (~5 min warm): GPU tests, then an EAGLE-3 head-step A/B on the same card.
#  1. TESTS="tests/x.py[::test] ...": those GPU test files or ids, in two pytest processes
#     (nothing there is timed; split by halves of the list);
#  2. with AB=DIR (the "before" tree: graphrt/ and tools/ of an earlier commit laid over this
#     tree's), tools/bench_eagle3_step.py there, then here (with --profile "chain step,extend"):
#     the 8B-shape chain step / draft-extend / round vs the weight-bytes floor, before and after.
#   rm -rf .ab && mkdir .ab && git archive COMMIT graphrt tools | tar -x -C .ab
#   TESTS="..." AB=.ab DEADLINE=420 bash .device/bootstrap.sh bash tools/device/step_tests_ab.sh   (carry .device, .ab)
NAME=step_tests_ab; DEADLINE=${DEADLINE:-420}; . tools/device/lib.sh   # logs, pack, cap, say
if [ -n "${TESTS:-}" ]; then
  set -- $TESTS; half=$(( ($# + 1) / 2 )); A="${*:1:$half}"; B="${*:$((half + 1))}"
  timeout $(cap 300) python -m pytest -m gpu -q -s -rfEs --tb=short -p no:cacheprovider $A > "$L/tests_a.log" 2>&1 &
  PA=$!
  if [ -n "$B" ]; then
    timeout $(cap 300) python -m pytest -m gpu -q -s -rfEs --tb=short -p no:cacheprovider $B > "$L/tests_b.log" 2>&1
  fi
  wait $PA
  for f in "$L"/tests_*.log; do say "$(basename "$f"): $(grep -E "passed|failed|error" "$f" | tail -1)"; done
  grep -hE "^(FAILED|ERROR)" "$L"/tests_*.log | cut -c1-300 | tee -a "$S"; pack
fi
if [ -n "${AB:-}" ]; then
  rm -rf /tmp/before && mkdir -p /tmp/before && cp -r graphrt tools /tmp/before/ && cp -r "$AB"/. /tmp/before/
  (cd /tmp/before && PYTHONPATH=/tmp/before:/tmp/graphrt-site:/tmp/site timeout $(cap 90) python tools/bench_eagle3_step.py \
     --batch 1,4 --json "$L/bench_eagle3_step_before.json" > "$L/bench_eagle3_step_before.log" 2>&1); say "bench before rc=$?"
fi
timeout $(cap 90) python tools/bench_eagle3_step.py --batch 1,4 --profile "chain step,extend" \
  --json "$L/bench_eagle3_step_after.json" > "$L/bench_eagle3_step_after.log" 2>&1; say "bench after rc=$?"; pack
for w in before after; do [ -f "$L/bench_eagle3_step_$w.log" ] && { echo "== $w"; grep -vE "^  |Warning|_warn_once" "$L/bench_eagle3_step_$w.log"; }; done | tee -a "$S"
cat "$S"
