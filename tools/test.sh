#!/usr/bin/env bash
# Sets up (tools/setup.sh) and runs every test: the layering check (tools/check_layers.sh), the
# default build, then the asan (ASan+UBSan) and tsan configs, the scale gate, the Bazel consumer
# workspace and the install tree's consumers (tools/test_install.sh). Tests run on the simulator
# (WEFT_DRIVER=sim, set by .bazelrc). Ends with one line "N passed, N failed" counting the
# layering check and the test targets over all configs.
#   tools/test.sh            all three configs
#   WEFT_TEST_CONFIGS="default" tools/test.sh   only some
set -uo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh || exit 1
configs="${WEFT_TEST_CONFIGS:-default asan tsan}"
passed=0
failed=0
# The layers, at the level of BUILD dependencies and of object symbols.
echo "=== tools/check_layers.sh"
if tools/check_layers.sh; then
  passed=$((passed + 1))
else
  echo "tools/check_layers.sh FAILED"
  failed=$((failed + 1))
fi
for c in $configs; do
  flags=()
  [ "$c" = default ] || flags=(--config="$c")
  echo "=== bazel test //... ${flags[*]:-}"
  log=$(mktemp)
  bazel test "${flags[@]}" //... 2>&1 | tee "$log" | grep -E "^//|FAIL|ERROR|Executed" || true
  p=$(grep -cE "^//[^ ]+ +(\(cached\) )?PASSED" "$log")
  f=$(grep -cE "^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD|INCOMPLETE)" "$log")
  if [ "$p" -eq 0 ] && [ "$f" -eq 0 ]; then
    echo "bazel test ${flags[*]:-} ran nothing (build failure?):"
    tail -30 "$log"
    f=1
  fi
  passed=$((passed + p))
  failed=$((failed + f))
  rm -f "$log"
done
# The scale gate: random programs of 10^6 operations with captures and replays, on the default
# and the lazy simulator, in an optimised build (tests/scale/BUILD).
echo "=== bazel test -c opt //tests/scale:scale_gate //tests/scale:scale_gate_lazy"
log=$(mktemp)
bazel test -c opt //tests/scale:scale_gate //tests/scale:scale_gate_lazy 2>&1 | tee "$log" | grep -E "^//|FAIL|ERROR|Executed" || true
p=$(grep -cE "^//[^ ]+ +(\(cached\) )?PASSED" "$log")
f=$(grep -cE "^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD|INCOMPLETE)" "$log")
[ "$p" -eq 0 ] && [ "$f" -eq 0 ] && f=1
passed=$((passed + p))
failed=$((failed + f))
rm -f "$log"
# weft as an external repository: the consumer workspace builds and runs (on the simulator).
echo "=== examples/consumer (weft through local_repository)"
if BAZEL="bazel --output_base=${TMPDIR:-/tmp}/weft_consumer_ob" examples/consumer/run.sh; then
  passed=$((passed + 1))
else
  echo "examples/consumer FAILED"
  failed=$((failed + 1))
fi
# Without Bazel: the install tree (tools/install.sh) and its CMake, Make, dlopen and ctypes consumers.
echo "=== tools/test_install.sh"
if tools/test_install.sh; then
  passed=$((passed + 1))
else
  echo "tools/test_install.sh FAILED"
  failed=$((failed + 1))
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
