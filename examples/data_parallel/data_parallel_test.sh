#!/usr/bin/env bash
# Every launch mode of the data-parallel example on two simulated devices with the simulated
# NCCL: one process driving both devices, one process per device (two processes sharing a unique
# id through a file, as across machines), and the per-process code with a thread per rank. Each
# must say OK, every rank must end with the same weights (the same hash), and the race oracle
# must find no race in any process.
set -uo pipefail
bin="$1"
export WEFT_DRIVER=sim WEFT_SIM_DEVICES=2 WEFT_NCCL=sim WEFT_SIM_REPORT=1
dir="${TEST_TMPDIR:-$(mktemp -d)}"
fail=0
# check NAME PROCESSES OUTPUT: OK from every process, two equal hashes, no race anywhere.
check() {
  local name="$1" procs="$2" out="$3"
  echo "$out"
  [ "$(echo "$out" | grep -cx OK)" = "$procs" ] || { echo "data_parallel_test: $name did not end OK"; fail=1; }
  [ "$(echo "$out" | grep -c 'weights hash')" = 2 ] || { echo "data_parallel_test: $name: not two ranks"; fail=1; }
  hashes=$(echo "$out" | sed -n 's/^rank [0-9]*: weights hash \([0-9a-f]*\),.*/\1/p' | sort -u)
  [ "$(echo "$hashes" | wc -l)" = 1 ] || { echo "data_parallel_test: $name: the ranks' weights differ"; fail=1; }
  [ "$(echo "$out" | grep -c "weft-sim: 0 race(s) found")" = "$procs" ] ||
    { echo "data_parallel_test: $name: the race oracle found races (or did not report)"; fail=1; }
}
for mode in "--ranks 2" "--rank-threads 2 --id-file $dir/id"; do
  rm -f "$dir/id"
  check "$mode" 1 "$("$bin" --steps 12 $mode 2>&1)"
done
# One process per device: rank 0 writes the id file, rank 1 reads it.
rm -f "$dir/id"
"$bin" --steps 12 --rank 1 --world 2 --id-file "$dir/id" >"$dir/rank1.log" 2>&1 &
pid=$!
out0=$("$bin" --steps 12 --rank 0 --world 2 --id-file "$dir/id" 2>&1)
wait $pid
rc1=$?
[ $rc1 = 0 ] || { echo "data_parallel_test: rank 1's process exited $rc1"; fail=1; }
check "two processes" 2 "$out0
$(cat "$dir/rank1.log")"
exit $fail
