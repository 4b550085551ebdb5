#!/bin/bash
# Diagnostic on the 2-GPU machine: (1) tools/diag_nccl_graph_p2p.c, captured send+recv without
# weft, in its four forms; (2) test_comm_long's minimal captured send+recv case, a thread per
# rank, under NCCL settings; every run still going after 40 s gets the stacks of all its threads
# (tools/stackdump.c preloaded, SIGUSR1; symbolise here with addr2line) and nvidia-smi in $OUT.
#   run  command="bash stage/diag_comm_long_gpu.sh"  carry=["stage"]  kind=nvidia-h100-x2
here=$(cd "$(dirname "$0")" && pwd)
export NCCL_SOCKET_IFNAME=lo LD_LIBRARY_PATH=$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
watch() { # name pid
  for i in $(seq 1 20); do sleep 2; kill -0 $2 2>/dev/null || break; done
  if kill -0 $2 2>/dev/null; then
    echo "$1: still running after 40 s"
    nvidia-smi --query-gpu=index,utilization.gpu --format=csv > $OUT/$1_smi.txt 2>&1
    kill -USR1 $2; sleep 2; kill -KILL $2
  fi
  wait $2; echo "$1 rc $?"
}
for form in "one plain" "one graphmem" "threads plain" "threads graphmem"; do
  n=raw_${form// /_}
  NCCL_DEBUG=WARN LD_PRELOAD=$here/lib/libstackdump.so STACKDUMP_FILE=$OUT/${n}_stacks.txt $here/bin/diag_nccl_graph_p2p $form > $OUT/$n.txt 2>&1 &
  watch $n $!; tail -3 $OUT/$n.txt
done
for envs in "X=1" "NCCL_GRAPH_REGISTER=0" "NCCL_GRAPH_MIXING_SUPPORT=0" "NCCL_RUNTIME_CONNECT=0"; do
  n=min_${envs%%=*}
  env $envs NCCL_DEBUG=WARN WEFT_TEST_VERBOSE=1 WEFT_TEST_FILTER=test_min_captured_sendrecv_thread_per_rank \
    LD_PRELOAD=$here/lib/libstackdump.so STACKDUMP_FILE=$OUT/${n}_stacks.txt $here/bin/test_comm_long > $OUT/$n.txt 2>&1 &
  watch $n $!; grep -E "OK|FAIL|rank|HANG|error" $OUT/$n.txt | tail -6
done
