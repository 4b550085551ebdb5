#!/usr/bin/env bash
# Runs the benchmark harness ($1) on the simulator with --quick; its CSV goes to the test's
# scratch folder. Passes when the harness exits 0 and printed every section (the collectives
# section again on two simulated devices, where it measures).
set -euo pipefail
export WEFT_DRIVER=sim OUT="${TEST_TMPDIR:-$(mktemp -d)}"
"$1" --quick | tee "$OUT/bench.md"
for section in "Allocation" "Tracker" "Waits issued" "Captured-step replay" "Pipeline"; do
  grep -q "^## $section" "$OUT/bench.md" || { echo "bench_smoke: section '$section' missing" >&2; exit 1; }
done
grep -q "simulator: not performance numbers" "$OUT/bench.md"
test -s "$OUT/bench.csv"
# The collectives section on two simulated devices with the simulated NCCL: a table row per size.
WEFT_SIM_DEVICES=2 WEFT_NCCL=sim "$1" --quick comm comm_procs dp | tee "$OUT/comm.md"
grep -q "^## Collectives" "$OUT/comm.md" || { echo "bench_smoke: section 'Collectives' missing" >&2; exit 1; }
grep -q "^| 1048576 |" "$OUT/comm.md" || { echo "bench_smoke: the collectives section measured nothing" >&2; exit 1; }
grep -q "^## Data-parallel step" "$OUT/comm.md" || { echo "bench_smoke: section 'Data-parallel step' missing" >&2; exit 1; }
grep -q "^A thread per rank" "$OUT/comm.md" || { echo "bench_smoke: the thread-per-rank all-reduce table is missing" >&2; exit 1; }
grep -q "^A process per rank" "$OUT/comm.md" || { echo "bench_smoke: the process-per-rank all-reduce table is missing" >&2; exit 1; }
test "$(grep -c "^| 1048576 |" "$OUT/comm.md")" -ge 3 || { echo "bench_smoke: an all-reduce table measured nothing" >&2; exit 1; }
for shape in "264 \| 4" "4224 \| 16"; do
  grep -qE "^\| $shape \| [0-9]" "$OUT/comm.md" ||
    { echo "bench_smoke: the data-parallel section measured nothing for $shape" >&2; exit 1; }
done
