#!/bin/bash
# Diagnostic on the 2-GPU machine (staged by tools/stage_gpu.sh): test_comm_long's
# thread-per-rank programs, seed 1, ring 4, every step of each thread printed; when they hang
# after 90 s, the last steps, nvidia-smi (and stacks where gdb exists) go to $OUT.
#   run  command="bash stage/diag_comm_long_gpu.sh"  carry=["stage"]  kind=nvidia-h100-x2
here=$(cd "$(dirname "$0")" && pwd)
export NCCL_SOCKET_IFNAME=lo LD_LIBRARY_PATH=$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for ring in 4; do
  WEFT_TEST_VERBOSE=1 WEFT_TEST_SEEDS=1 WEFT_TEST_OPS=300 WEFT_TEST_RINGS=$ring timeout -s KILL 100 $here/bin/test_comm_long > $OUT/cl_$ring.txt 2>&1 &
  pid=$!
  for i in $(seq 1 45); do sleep 2; kill -0 $pid 2>/dev/null || break; done
  if kill -0 $pid 2>/dev/null; then
    echo "ring $ring: hung after 90 s"
    (command -v gdb >/dev/null && gdb -p $pid -batch -ex "thread apply all bt 12" > $OUT/cl_${ring}_stacks.txt 2>&1) || echo "no gdb"
    nvidia-smi > $OUT/cl_${ring}_smi.txt 2>&1
    kill -KILL $pid
  fi
  wait $pid; echo "ring $ring rc $?"
  grep -E "^\[thread" $OUT/cl_$ring.txt | awk '{print $1,$2}' | sort | uniq -c | tail -3
  for t in 0 1; do grep "^\[thread $t\]" $OUT/cl_$ring.txt | tail -2; done
  grep -E "OK|FAILED|ERROR|error" $OUT/cl_$ring.txt | head -5
done
