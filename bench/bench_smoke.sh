#!/usr/bin/env bash
# Runs the benchmark harness ($1) on the simulator with --quick; its CSV goes to the test's
# scratch folder. Passes when the harness exits 0 and printed every section.
set -euo pipefail
export WEFT_DRIVER=sim OUT="${TEST_TMPDIR:-$(mktemp -d)}"
"$1" --quick | tee "$OUT/bench.md"
for section in "Allocation" "Tracker" "Waits issued" "Captured-step replay" "Pipeline"; do
  grep -q "^## $section" "$OUT/bench.md" || { echo "bench_smoke: section '$section' missing" >&2; exit 1; }
done
grep -q "simulator: not performance numbers" "$OUT/bench.md"
test -s "$OUT/bench.csv"
