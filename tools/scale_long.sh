#!/usr/bin/env bash
# The long scale gate (issue 11): //tests/scale's random programs, 50 seeds x 1,000,000
# operations on the default and the lazy simulator (WEFT_SIM_LAZY=1), seed s with event ring
# (4, 8, 64)[s % 3]. Builds with -c opt, runs seeds in parallel, prints each seed's line, the
# failures, the wall time and a summary; exits 1 if any seed failed.
#   tools/scale_long.sh
#   SEEDS=1-10 OPS=200000 MODES="lazy" JOBS=4 tools/scale_long.sh
# Variables: SEEDS (default 1-50), OPS (1000000), RINGS (4,8,64), MODES ("default lazy"),
# JOBS (processes at once; default: the number of CPUs), BAZEL (default "bazel"; e.g.
# "bazel --output_base=/tmp/ob"), LOGDIR (default: a new temporary folder, kept), and any
# WEFT_TEST_* / WEFT_SIM_* variable of tests/scale/scale.h, passed through.
set -uo pipefail
cd "$(dirname "$0")/.."
SEEDS="${SEEDS:-1-50}"
OPS="${OPS:-1000000}"
RINGS="${RINGS:-4,8,64}"
MODES="${MODES:-default lazy}"
JOBS="${JOBS:-$(nproc)}"
BAZEL="${BAZEL:-bazel}"
LOGDIR="${LOGDIR:-$(mktemp -d "${TMPDIR:-/tmp}/scale_long.XXXXXX")}"
mkdir -p "$LOGDIR"

$BAZEL build -c opt //tests/scale:scale_gate >"$LOGDIR/build.log" 2>&1 || {
  tail -30 "$LOGDIR/build.log"
  echo "scale_long: build failed"
  exit 2
}
bin="$($BAZEL info -c opt bazel-bin 2>/dev/null)/tests/scale/scale_gate"
[ -x "$bin" ] || { echo "scale_long: no binary at $bin"; exit 2; }

# Expand "1-3,7" into one seed per line.
seeds=$(echo "$SEEDS" | tr ',' '\n' | while IFS=- read -r a b; do seq "$a" "${b:-$a}"; done)
nseeds=$(echo "$seeds" | wc -l)
echo "scale_long: $nseeds seeds x $OPS ops, rings $RINGS, modes: $MODES, $JOBS jobs; logs in $LOGDIR"

run_one() { # mode seed
  local lazy=0
  [ "$1" = lazy ] && lazy=1
  RUNFILES_DIR="$bin.runfiles" WEFT_DRIVER=sim WEFT_SIM_LAZY=$lazy WEFT_TEST_SEEDS="$2" WEFT_TEST_OPS="$OPS" \
    WEFT_TEST_RINGS="$RINGS" "$bin" >"$LOGDIR/$1.$2.out" 2>"$LOGDIR/$1.$2.err"
  echo "$?" >"$LOGDIR/$1.$2.rc"
}
export -f run_one
export bin OPS RINGS LOGDIR

start=$(date +%s.%N)
for m in $MODES; do
  for s in $seeds; do echo "$m $s"; done
done | xargs -P "$JOBS" -n 2 bash -c 'run_one "$0" "$1"'
wall=$(echo "$(date +%s.%N) - $start" | bc)

failed=0
total=0
for m in $MODES; do
  echo "=== $m simulator"
  for s in $seeds; do
    total=$((total + 1))
    grep -h "^seed " "$LOGDIR/$m.$s.out" || echo "seed $s: no result (crashed? see $LOGDIR/$m.$s.err)"
    rc=$(cat "$LOGDIR/$m.$s.rc" 2>/dev/null || echo 99)
    if [ "$rc" != 0 ]; then
      failed=$((failed + 1))
      grep -h "reproduce:" "$LOGDIR/$m.$s.out"
      grep -h "gave\|^FAIL.*race:" "$LOGDIR/$m.$s.err" | head -2 | cut -c1-300 | sed 's/^/    /'
      [ "$rc" -gt 128 ] && echo "    exit status $rc (signal $((rc - 128))): $(tail -1 "$LOGDIR/$m.$s.err")"
    fi
  done
done
cat "$LOGDIR"/*.out | awk -v wall="$wall" -v failed="$failed" -v total="$total" '
  /^seed / {
    for (i = 1; i <= NF; i++) {
      if ($i == "ops" && $(i + 1) == "in") { ops += $(i - 1); secs += $(i + 2) }
      if ($i == "races") races += $(i + 1)
      if ($i == "words") bad += $(i + 1)
    }
  }
  END {
    rate = secs > 0 ? ops / secs : 0
    printf "scale_long: %d of %d runs failed; %d ops in %.1f s of run time (%.0f ops/s per process), wall %.1f s; races %d, wrong words %d\n", failed, total, ops, secs, rate, wall, races, bad
  }'
[ "$failed" -eq 0 ]
