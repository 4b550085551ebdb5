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
grep -q "^1 MiB, the typical iteration" "$OUT/comm.md" || { echo "bench_smoke: the typical-iteration line is missing" >&2; exit 1; }
grep -q "^A thread per rank" "$OUT/comm.md" || { echo "bench_smoke: the thread-per-rank all-reduce table is missing" >&2; exit 1; }
grep -q "^A process per rank" "$OUT/comm.md" || { echo "bench_smoke: the process-per-rank all-reduce table is missing" >&2; exit 1; }
test "$(grep -c "^| 1048576 |" "$OUT/comm.md")" -ge 3 || { echo "bench_smoke: an all-reduce table measured nothing" >&2; exit 1; }
for shape in "264 \| 4" "4224 \| 16"; do
  grep -qE "^\| $shape \| [0-9]" "$OUT/comm.md" ||
    { echo "bench_smoke: the data-parallel section measured nothing for $shape" >&2; exit 1; }
done
# Every collectives sample is a positive, finite time, and no rank's host time to enqueue passes
# its all-reduces' whole time (the same row, size and repetition): an enqueue cannot end after its
# work. (A start read by the wrong thread once gave 9.2e14 us: bench_comm.c, run_threads.)
python3 - "$OUT/bench.csv" <<'PY'
import csv, math, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["section"] == "comm"]
assert rows, "bench_smoke: no collectives samples in the CSV"
total = {}
for r in rows:
    v = float(r["value"])
    if r["unit"] in ("us", "ns") and not (math.isfinite(v) and v > 0):
        sys.exit("bench_smoke: %s, %s, x = %s, repetition %s: %r %s" % (r["row"], r["metric"], r["x"], r["rep"], v, r["unit"]))
    if r["metric"] == "us per all-reduce":
        total[(r["row"], r["x"], r["rep"])] = v
checked = 0
for r in rows:
    key = (r["row"], r["x"], r["rep"])
    if r["metric"] == "host us to enqueue" and key in total:
        checked += 1
        if float(r["value"]) > total[key] * 1.000001:
            sys.exit("bench_smoke: %s, x = %s, repetition %s: host %s us > whole %s us" % (r["row"], r["x"], r["rep"], r["value"], total[key]))
assert checked > 0, "bench_smoke: no host time beside a whole time"
PY
