#!/usr/bin/env bash
# Both launch modes of the data-parallel example on two simulated devices with the simulated
# NCCL: each must say OK, every rank must end with the same weights (the same hash), and the race
# oracle must find no race.
set -uo pipefail
bin="$1"
export WEFT_DRIVER=sim WEFT_SIM_DEVICES=2 WEFT_NCCL=sim WEFT_SIM_REPORT=1
dir="${TEST_TMPDIR:-$(mktemp -d)}"
fail=0
for mode in "--ranks 2" "--rank-threads 2 --id-file $dir/id"; do
  rm -f "$dir/id"
  out=$("$bin" --steps 12 $mode 2>&1)
  echo "$out"
  echo "$out" | tail -1 | grep -qx OK || { echo "data_parallel_test: $mode did not end OK"; fail=1; }
  hashes=$(echo "$out" | sed -n 's/^rank [0-9]*: weights hash \([0-9a-f]*\),.*/\1/p' | sort -u)
  [ "$(echo "$out" | grep -c 'weights hash')" = 2 ] || { echo "data_parallel_test: $mode: not two ranks"; fail=1; }
  [ "$(echo "$hashes" | wc -l)" = 1 ] || { echo "data_parallel_test: $mode: the ranks' weights differ"; fail=1; }
  echo "$out" | grep -q "weft-sim: 0 race(s) found" || { echo "data_parallel_test: $mode: the race oracle found races"; fail=1; }
done
exit $fail
