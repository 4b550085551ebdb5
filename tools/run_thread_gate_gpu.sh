#!/usr/bin/env bash
# On the GPU machine: the thread gate (tests/threads:test_thread_gate, one test, 8 threads) run
# again and again until a time budget is spent, alternating the binaries given, with a table of
# each run (result, seconds, elements that differed). Logs of failed runs go to $OUT.
#   bash stage/run_thread_gate_gpu.sh SECONDS ITERS NAME=BINARY [NAME=BINARY...]
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-/tmp}"
budget="$1"; iters="$2"; shift 2
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset WEFT_DRIVER
end=$(( $(date +%s) + budget ))
declare -A runs fails
printf '%-4s %-10s %-8s %8s  %s\n' run binary result seconds "data mismatches"
i=0
while [ "$(date +%s)" -lt "$end" ]; do
  for pair in "$@"; do
    name="${pair%%=*}"; bin="${pair#*=}"
    [ "$(date +%s)" -lt "$end" ] || break
    i=$((i + 1))
    start=$(date +%s.%N)
    THREAD_GATE_ONLY=gate_default_ring THREAD_GATE_ITERS="$iters" THREAD_GATE_SEED="$i" timeout 300 "$bin" > "$out/tg_$i.log" 2>&1
    rc=$?
    secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    bad=$(grep -c "^.*data: " "$out/tg_$i.log")
    runs[$name]=$(( ${runs[$name]:-0} + 1 ))
    if [ $rc -eq 0 ]; then result=PASS; rm -f "$out/tg_$i.log"; else result="FAIL($rc)"; fails[$name]=$(( ${fails[$name]:-0} + 1 )); fi
    printf '%-4s %-10s %-8s %8s  %s\n' "$i" "$name" "$result" "$secs" "$bad"
  done
done
for pair in "$@"; do
  name="${pair%%=*}"
  echo "$name: ${fails[$name]:-0} of ${runs[$name]:-0} runs failed"
done
