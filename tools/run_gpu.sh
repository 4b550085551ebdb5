#!/usr/bin/env bash
# Runs every staged binary on the GPU machine with the real driver and prints a summary table
# (name, result, seconds). All logs go to $OUT/gpu_logs.txt (the device tool's folder) or next to it.
#   bash stage/run_gpu.sh [name-pattern]
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset WEFT_DRIVER
# One log file per binary while running; all of them concatenated into gpu_logs.txt at the end
# (the device tool brings back only a few files).
logs="$(mktemp -d)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
# What bench/results.py puts at the head of RESULTS.md (weft_bench's CSV lands beside it).
{
  echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) x $(nvidia-smi -L 2>/dev/null | wc -l)"
  echo "driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
  echo "commit: $(cat "$here/COMMIT" 2>/dev/null || echo unknown)"
  echo "date: $(date -u +%Y-%m-%d)"
  echo "command: tools/stage_gpu.sh, then on the GPU machine bash stage/run_gpu.sh${1:+ $1}"
} > "${OUT:-$here}/meta.txt"
pattern="${1:-}"
rows=()
pass=0
fail=0
total_skips=0
for bin in "$here"/bin/*; do
  name=$(basename "$bin")
  [ -z "$pattern" ] || [[ "$name" == *$pattern* ]] || continue
  start=$(date +%s.%N)
  # Per-binary settings that Bazel's env attribute gives the tests (staged binaries run bare).
  envs=()
  case "$name" in
    scale_gpu) envs=(WEFT_TEST_SEEDS=1-3 WEFT_TEST_OPS=20000 WEFT_TEST_RINGS=4,8,64 WEFT_TEST_KEEP_GOING=1) ;;
    test_torch_adapter|test_torch_threads|test_torch_pools) envs=(WEFT_TORCH_LIB="$here/torch/libweft_torch.so") ;;
    test_comm_long) envs=(WEFT_TEST_SEEDS=1-4 WEFT_TEST_OPS=300 WEFT_TEST_RINGS=4,64) ;;
    test_thread_gate_2dev) envs=(THREAD_GATE_DEVICES=2 THREAD_GATE_ONLY=gate_) ;;
    test_comm_exact_waits_ring4) envs=(WEFT_TEST_RING=4 WEFT_TEST_LAZY=0) ;;
    test_comm_exact_waits_lazy_ring4) envs=(WEFT_TEST_RING=4 WEFT_TEST_LAZY=1) ;;
    test_torch_raise) envs=(WEFT_TORCH_LIB="$here/torch/libweft_torch.so" WEFT_C10_STUB="$here/torch/libc10_stub.so") ;;
    test_torch_raise_c) envs=(WEFT_TORCH_LIB="$here/torch/libweft_torch.so" WEFT_TEST_NO_C10=1) ;;
  esac
  env "${envs[@]}" timeout 300 "$bin" >"$logs/$name.log" 2>&1
  rc=$?
  # cmocka's skip(): a check whose precondition did not happen on this machine. Counted, never OK.
  # cmocka prints a skipped test's name twice (as it runs, and in the closing list): count names.
  skips=$(grep -E '^\[  SKIPPED \] [A-Za-z_]' "$logs/$name.log" | sort -u | wc -l)
  total_skips=$((total_skips + skips))
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
  if [ $rc -eq 0 ]; then result=PASS; pass=$((pass + 1)); else result="FAIL($rc)"; fail=$((fail + 1)); fi
  rows+=("$(printf '%-40s %-9s %8.2f %6s' "$name" "$result" "$secs" "$skips")")
  if [ $rc -ne 0 ]; then echo "---- $name (rc $rc), last lines:"; tail -25 "$logs/$name.log"; fi
done
for f in "$logs"/*.log; do
  printf '\n==================== %s\n' "$(basename "$f" .log)"
  cat "$f"
done > "${OUT:-$here}/gpu_logs.txt"
echo
printf '%-40s %-9s %8s %6s\n' binary result seconds skips
printf '%s\n' "${rows[@]}"
echo "$pass passed, $fail failed, $total_skips tests skipped"
