#!/usr/bin/env bash
# One H200 call (~7 min): the trained family (target 50 s + draft) and an EAGLE-3 head, then bench_spec
# part 2 (none / ngram / eagle3 through LLM, x runner and busy from the engine's block times) on the
# tree "before" (this tree with the files under $AB swapped in) and on this tree, same family, one
# after the other: the A/B of a change to the speculative round or the decode step.
# Make the mirror first (here, not on the device): the whole graphrt/ of the "before" commit laid
# over this tree's (a file only this tree has stays, unused by the older code). E.g. round 18's
# launch cuts against the tree before them:
#   rm -rf .ab && mkdir .ab && git archive 28f640b graphrt | tar -x -C .ab
# (round 17's fewer-nodes commit: 358275a~1; its bench_spec lacks nothing this script asks for)
#   AB=.ab DEADLINE=540 bash .device/bootstrap.sh bash tools/device/spec_ab.sh      (carry .device and .ab)
# TESTS="tests/x.py::test_y ..." runs those GPU tests beside the training (logged to tests.log).
# The before tree keeps this tree's tools/ (the same bench for both).
NAME=spec_ab; DEADLINE=${DEADLINE:-540}; . tools/device/lib.sh   # logs, pack, cap, say
DIR=/tmp/fam; rm -rf "$DIR"
[ -n "${AB:-}" ] && [ -d "$AB" ] || { echo "spec_ab: AB=DIR (the before-tree mirror) is required" >&2; exit 2; }
# TESTS="pytest node ids": GPU tests run during the training (nothing there is timed), done before the benches
if [ -n "${TESTS:-}" ]; then
  ( timeout $(cap 200) python -m pytest -m gpu -q -s -rfEs --tb=short -p no:cacheprovider $TESTS > "$L/tests.log" 2>&1
    echo "tests rc=$?" >> "$L/tests.log" ) &
  TPID=$!
fi
train_family "$DIR"
[ -n "${TESTS:-}" ] && { wait $TPID; say "$(grep -E "passed|failed" "$L/tests.log" | tail -1)"; }
rm -rf /tmp/before && mkdir -p /tmp/before && cp -r graphrt tools /tmp/before/ && cp -r "$AB"/. /tmp/before/
for w in before after; do
  if [ $w = before ]; then cd /tmp/before; export PYTHONPATH=/tmp/before:/tmp/graphrt-site:/tmp/site; else cd "$OLDPWD"; export PYTHONPATH="$PWD:/tmp/graphrt-site:/tmp/site"; fi
  timeout $(cap 150) python tools/bench_spec.py --trained "$DIR" --methods none,ngram,draft,eagle3 --prompts 6 \
    --out "$L/bench_$w.json" > "$L/bench_$w.log" 2>&1; say "bench $w rc=$?"; pack
done
for w in before after; do echo "== $w"; sed -n '/^part 2/,/^$/p' "$L/bench_$w.log"; done | tee -a "$S"
cat "$S"
