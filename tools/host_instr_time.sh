#!/bin/bash
# What cold first-level cache lines cost weft's hot paths on this machine's CPU (the simulator as
# driver, so it runs anywhere, GPU hosts included): per path, the time per operation hot, and
# with HOST_INSTR_EVICT's eviction after every operation minus the eviction alone, in
# interleaved repetitions (bench/host_instr.c, HOST_INSTR_TIME).
#   tools/host_instr_time.sh [BIN_DIR]   (BIN_DIR holds host_instr and libweft_sim.so; default:
#                                        build them here)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -ge 1 ]; then
  bin=$1/host_instr sim=$1
else
  bazel build -c opt //bench:host_instr //sim:libweft_sim.so >/dev/null 2>&1
  out=$(bazel info -c opt bazel-bin 2>/dev/null)
  bin=$out/bench/host_instr sim=$out/sim
fi
ev=${EVICT:-65536} n=${N:-50000} reps=${REPS:-5}
t() { # path, evict bytes -> ns per op
  HOST_INSTR_TIME=1 HOST_INSTR_EVICT=$2 WEFT_DRIVER=sim LD_LIBRARY_PATH="$sim" "$bin" "$1" "$n" 2>&1 >/dev/null |
    awk '/ns\/op/ {print $2}'
}
echo "| path | hot ns/op (median of $reps) | cold minus eviction ns/op (median of $reps; eviction $ev bytes) |"
echo "| --- | ---: | ---: |"
for p in ${PATHS:-use1 use16 edge launch pool}; do
  hot=() cold=()
  for r in $(seq "$reps"); do
    hot+=("$(t "$p" 0)")
    a=$(t evict "$ev"); c=$(t "$p" "$ev"); b=$(t evict "$ev")
    cold+=("$(awk -v c="$c" -v a="$a" -v b="$b" 'BEGIN {printf "%.1f", c - (a + b) / 2}')")
  done
  med() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
  echo "| $p | $(med "${hot[@]}") | $(med "${cold[@]}") |"
done
