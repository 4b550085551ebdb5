#!/usr/bin/env bash
# On the 2-GPU machine (after tools/stage_gpu.sh): may a graph call on one device overlap another
# thread's enqueue on the other device? (lib/core/gate.h: the gate is per device.) Runs the thread
# gate on two devices (THREAD_GATE_DEVICES=2: threads 0, 2, 4, 6 on device 0, the others on
# device 1) again and again, alternating weft's gate per device (WEFT_GATE=device, the default)
# with no gate at all (WEFT_GATE=off, the positive control: graph calls overlap enqueues on their
# own device too, which gave wrong data on one device). Then the full-queue case of
# tests/comm/test_comm_long (the deadlock the per-device gate removes) several times.
#   bash stage/run_gate_scope_gpu.sh [SECONDS [ITERS [QUEUE_RUNS]]]
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
budget="${1:-300}"; iters="${2:-16000}"; queue_runs="${3:-5}"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_SOCKET_IFNAME=lo
unset WEFT_DRIVER
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/gpu: /'
echo "commit: $(cat "$here/COMMIT" 2>/dev/null)"
w="$(mktemp -d)"
for mode in device off; do
  printf '#!/bin/sh\nWEFT_GATE=%s THREAD_GATE_DEVICES=2 exec %s "$@"\n' "$mode" "$here/bin/test_thread_gate" > "$w/$mode.sh"
  chmod +x "$w/$mode.sh"
done
bash "$here/run_thread_gate_gpu.sh" "$budget" "$iters" device="$w/device.sh" off="$w/off.sh"
echo "== the full queue behind an all-reduce, a thread per rank ($queue_runs runs)"
for i in $(seq "$queue_runs"); do
  WEFT_TEST_FILTER='test_min_full*' WEFT_TEST_VERBOSE=1 timeout 120 "$here/bin/test_comm_long" > "$w/q.log" 2>&1
  rc=$?
  echo "run $i rc $rc: $(grep -E 'graph calls done|OK|SKIPPED|FAILED|ERROR' "$w/q.log" | head -3 | tr '\n' ' ')"
done
