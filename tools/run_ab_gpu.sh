#!/usr/bin/env bash
# An interleaved A/B of two weft_bench builds on the GPU machine (tools/ab_bench.sh), staged as
# stage/ab/base_weft_bench and stage/ab/new_weft_bench (static builds of each commit: bazel build
# -c opt --dynamic_mode=off //bench:weft_bench) beside ab_bench.sh and this script:
#   ROUNDS=4 AB_LIMIT=300 bash stage/ab/run_ab_gpu.sh SECTION [SECTION ...]
# ROUNDS rounds (default 4) within AB_LIMIT seconds (default 300: the rounds done by then are
# kept). Everything (machine.txt, each round's output and CSV) goes to $OUT/ab.tgz; summarise it
# with python3 tools/ab_summary.py FOLDER.
set -u
[ $# -ge 1 ] || { echo "usage: run_ab_gpu.sh SECTION [SECTION ...]" >&2; exit 2; }
export NCCL_SOCKET_IFNAME=lo
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$OUT/ab"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/ab/machine.txt" 2>&1
lscpu | grep -E "Model name|L1i|L2|^CPU\(s\)" >> "$OUT/ab/machine.txt" 2>&1
(cd "$OUT/ab" && OUT="$OUT/ab" timeout "${AB_LIMIT:-300}" bash "$here/ab_bench.sh" "$here/base_weft_bench" "$here/new_weft_bench" "${ROUNDS:-4}" "$@")
for f in "$OUT"/ab/*.csv; do [ -e "$f" ] && gzip -f "$f"; done
tar czf "$OUT/ab.tgz" -C "$OUT/ab" . && rm -rf "$OUT/ab"
