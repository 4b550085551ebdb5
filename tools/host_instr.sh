#!/bin/bash
# Instructions per operation of weft's hot host paths, on the simulator (bench/host_instr.c):
# callgrind counts the instructions of host_instr's own objects (weft; not the simulator, libc or
# libpthread) inside each path's loop, divided by the loop's count, and the pthread_mutex_lock
# calls weft makes there (tools/callgrind_locks.py): on the GPU host a lock and its unlock cost
# more than a hundred instructions do.
#   tools/host_instr.sh [PATH ...]     (default: every path)
set -euo pipefail
cd "$(dirname "$0")/.."
paths=("$@")
[ ${#paths[@]} -gt 0 ] || paths=(use1 use4 use16 eager1 eager16 edge launch alloc pool torch)
bazel build -c opt //bench:host_instr //sim:libweft_sim.so >/dev/null 2>&1
# The optimised outputs' own paths (bazel-bin follows whichever configuration built last).
out=$(bazel info -c opt bazel-bin 2>/dev/null)
bin=$out/bench/host_instr
sim=$out/sim
n=2000
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '| path | weft instructions per operation | mutex locks per operation |\n| --- | ---: | ---: |\n'
for p in "${paths[@]}"; do
  case $p in
    use*|eager*) fn=path_use ;;
    launch) fn=path_run ;;
    *) fn=path_$p ;;
  esac
  WEFT_DRIVER=sim LD_LIBRARY_PATH="$sim" valgrind --tool=callgrind --callgrind-out-file="$tmp/cg" \
    --toggle-collect="$fn*" "$bin" "$p" "$n" >/dev/null 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
  # Self cost of every function of the binary (weft is linked in statically); the warm-up round
  # runs n/10 more operations.
  total=$(callgrind_annotate --threshold=100 "$tmp/cg" 2>/dev/null | { grep "host_instr\]" || true; } |
          awk '{gsub(",","",$1); s+=$1} END {print s+0}')
  locks=$(python3 tools/callgrind_locks.py "$tmp/cg" host_instr)
  awk -v t="$total" -v l="$locks" -v n="$n" -v p="$p" \
    'BEGIN {printf "| %s | %.0f | %.2f |\n", p, t / (n + n / 10), l / (n + n / 10)}'
done
