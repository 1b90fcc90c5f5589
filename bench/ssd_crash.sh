#!/usr/bin/env bash
# The SSD store under kill -9: a writer fills the store as fast as it takes blocks, is killed at a
# random moment, and a checker reopens the store and reads back every block it offers. Any block
# read back with status 0 but wrong bytes, or a checker that crashes, fails the run.
#   usage: bench/ssd_crash.sh [ITERATIONS (100)] [DIR (a fresh temp dir)] [BUILD (build)]
set -euo pipefail
cd "$(dirname "$0")/.."
iters=${1:-100}
dir=${2:-$(mktemp -d "${TMPDIR:-/tmp}/inferd-ssd-crash-XXXXXX")}
build=${3:-build}
bin=$build/ssd_store_bench
[ -x "$bin" ] || { echo "ssd_crash: $bin is missing (ninja -C $build ssd_store_bench)" >&2; exit 2; }
date -u +"%Y-%m-%d %H:%M UTC"
echo "dir $dir ($(df -T "$dir" | awk 'NR==2 {print $2}')), $iters iterations"
wrong=0 crashes=0 offered=0 good=0 failed=0 recovered=0 dropped=0 vfail=0 rebuilt=0 torn=0
for i in $(seq 1 "$iters"); do
  "$bin" --crash-writer "$dir" $((i * 97)) & pid=$!
  # 50 ms to 1.05 s: the first instants (open, recovery) and steady writing with eviction alike
  sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.3f", 0.05 + r / 32767 }')"
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  set +e
  line=$("$bin" --crash-check "$dir" 2>/dev/null); rc=$?
  set -e
  if [ $rc -eq 1 ]; then wrong=$((wrong + 1)); echo "iteration $i: WRONG DATA: $line"
  elif [ $rc -ne 0 ]; then crashes=$((crashes + 1)); echo "iteration $i: checker exit $rc"
  fi
  read -r _ o _ g _ f _ _ _ rec _ dr _ vf _ rb _ tt _ _ <<<"$line" || true
  offered=$((offered + ${o:-0})); good=$((good + ${g:-0})); failed=$((failed + ${f:-0}))
  recovered=$((recovered + ${rec:-0})); dropped=$((dropped + ${dr:-0}))
  vfail=$((vfail + ${vf:-0})); rebuilt=$((rebuilt + ${rb:-0})); torn=$((torn + ${tt:-0}))
done
echo "iterations $iters: wrong restores $wrong, checker crashes $crashes"
echo "blocks offered $offered, read back right $good, failed verification or gone $failed"
echo "at open: recovered past the index $recovered, index rows dropped $dropped, torn segment tails cut $torn, index rebuilt $rebuilt times; read verify failures $vfail"
[ -z "${2:-}" ] && rm -rf "$dir"
[ $wrong -eq 0 ] && [ $crashes -eq 0 ]
