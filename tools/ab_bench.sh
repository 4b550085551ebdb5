#!/usr/bin/env bash
# Same-machine A/B of two weft_bench binaries: ROUNDS interleaved rounds (base, new, base, ...),
# each running the given sections; every round's full output lands in $OUT/ab_<base|new>_<round>.txt
# and its CSV in $OUT/ab_<base|new>_<round>.csv. Host figures move about 2x between runs minutes
# apart, so compare rounds side by side, not one run against an older one.
#   bash tools/ab_bench.sh BASE_BIN NEW_BIN ROUNDS SECTION [SECTION ...]
set -uo pipefail
[ $# -ge 4 ] || { echo "usage: ab_bench.sh BASE_BIN NEW_BIN ROUNDS SECTION [SECTION ...]" >&2; exit 2; }
base=$1 new=$2 rounds=$3
shift 3
out=${OUT:-.}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for r in $(seq 1 "$rounds"); do
  for v in base new; do
    bin=$base
    [ "$v" = new ] && bin=$new
    OUT=$tmp "$bin" "$@" > "$out/ab_${v}_$r.txt" 2>&1
    echo "$v round $r: rc $? ($(tail -1 "$out/ab_${v}_$r.txt"))"
    cp "$tmp/bench.csv" "$out/ab_${v}_$r.csv" 2>/dev/null
  done
done
