#!/bin/bash
# Instructions per operation of weft's hot host paths, on the simulator (bench/host_instr.c):
# callgrind counts the instructions of host_instr's own objects (weft; not the simulator, libc or
# libpthread) inside each path's loop, divided by the loop's count, and the calls weft makes
# there (tools/callgrind_calls.py) that cost more on a GPU host than instructions show: mutex
# locks, and the driver calls a use may make beside its work. A second run per path simulates the
# caches with the first-level data cache emptied after every operation (HOST_INSTR_EVICT: a
# driver call beside each use, NCCL's group launch, does much the same on a GPU host) and counts
# weft's first-level data misses: the cache lines an operation brings back ("lines, cold"). A third
# counts the code an operation runs (tools/footprint.py): weft's distinct instructions run at least
# once per operation and the 64-byte lines they lie in ("code lines"), and the locked
# read-modify-writes weft's own code runs per operation (tools/locked_ops.py: atomic adds,
# exchanges, compare-and-swaps; the mutexes' own are in the C library, counted as mutex locks).
#   tools/host_instr.sh [PATH ...]     (default: every path)
set -euo pipefail
cd "$(dirname "$0")/.."
paths=("$@")
[ ${#paths[@]} -gt 0 ] || paths=(use1 use4 use16 eager1 eager16 edge launch step alloc pool torch torch0 cpair cpair0 group ranks)
bazel build -c opt //bench:host_instr //sim:libweft_sim.so >/dev/null 2>&1
# The optimised outputs' own paths (bazel-bin follows whichever configuration built last).
out=$(bazel info -c opt bazel-bin 2>/dev/null)
bin=$out/bench/host_instr
sim=$out/sim
n=2000
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '| path | weft instructions | lines, cold | code lines | locked RMWs | mutex locks | cuCtxGetCurrent | cuCtxSetCurrent | cuStreamGetCaptureInfo | cuStreamIsCapturing | event records | stream waits |\n'
printf '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n'
for p in "${paths[@]}"; do
  n=2000
  [ "$p" = group ] || [ "$p" = ranks ] && n=200 # each reduces 1 MiB per rank on the simulator: slow under callgrind
  case $p in
    use*|eager*) fn=path_use ;;
    launch) fn=path_run ;;
    step) fn=path_step ;;
    torch0) fn=path_torch ;;
    cpair*) fn=path_cpair ;;
    *) fn=path_$p ;;
  esac
  WEFT_DRIVER=sim WEFT_NCCL=sim WEFT_SIM_DEVICES=2 LD_LIBRARY_PATH="$sim" valgrind --tool=callgrind --callgrind-out-file="$tmp/cg" \
    --toggle-collect="$fn*" "$bin" "$p" "$n" >/dev/null 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
  # Self cost of every function of the binary (weft is linked in statically); the warm-up round
  # runs n/10 more operations.
  total=$(callgrind_annotate --threshold=100 "$tmp/cg" 2>/dev/null | { grep "host_instr\]" || true; } |
          awk '{gsub(",","",$1); s+=$1} END {print s+0}')
  # First-level data misses of the same functions, the cache emptied after every operation.
  HOST_INSTR_EVICT=262144 WEFT_DRIVER=sim WEFT_NCCL=sim WEFT_SIM_DEVICES=2 LD_LIBRARY_PATH="$sim" valgrind --tool=callgrind \
    --cache-sim=yes --callgrind-out-file="$tmp/cgc" --toggle-collect="$fn*" "$bin" "$p" "$n" >/dev/null 2>"$tmp/err" ||
    { cat "$tmp/err" >&2; exit 1; }
  lines=$(callgrind_annotate --threshold=100 --show=D1mr,D1mw --show-percs=no "$tmp/cgc" 2>/dev/null |
          { grep "host_instr\]" || true; } | { grep -v ":evict " || true; } |
          awk '{for (i = 1; i <= 2; i++) {gsub(",", "", $i); if ($i == ".") $i = 0}; s += $1 + $2} END {print s+0}')
  WEFT_DRIVER=sim WEFT_NCCL=sim WEFT_SIM_DEVICES=2 LD_LIBRARY_PATH="$sim" valgrind --tool=callgrind --dump-instr=yes \
    --compress-pos=no --compress-strings=no --dump-line=no --callgrind-out-file="$tmp/cgi" --toggle-collect="$fn*" \
    "$bin" "$p" "$n" >/dev/null 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
  code=$(python3 tools/footprint.py "$tmp/cgi" "$n" --object host_instr --total | cut -d' ' -f2)
  rmw=$(python3 tools/locked_ops.py "$tmp/cgi" "$bin" "$((n + n / 10))")
  calls=$(python3 tools/callgrind_calls.py "$tmp/cg" host_instr pthread_mutex_lock cuCtxGetCurrent cuCtxSetCurrent \
          cuStreamGetCaptureInfo cuStreamIsCapturing cuEventRecord cuStreamWaitEvent)
  awk -v t="$total" -v l="$lines" -v c="$calls" -v n="$n" -v p="$p" -v code="$code" -v rmw="$rmw" 'BEGIN {
    k = split(c, v, " "); ops = n + n / 10
    printf "| %s | %.0f | %.1f | %d | %s |", p, t / ops, l / ops, code, rmw
    for (i = 1; i <= k; i++) printf " %.2f |", v[i] / ops
    printf "\n" }'
done
