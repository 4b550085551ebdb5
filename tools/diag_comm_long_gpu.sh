#!/bin/bash
# Diagnostic on the 2-GPU machine (after tools/stage_gpu.sh): test_comm_long cases chosen by
# DIAG_FILTER (default: the test_min_* cases) under NCCL settings; a run still going after 40 s
# gets the stacks of all its threads (tools/stackdump.c preloaded, SIGUSR1; symbolise here with
# addr2line against the same binary) and the GPUs' utilisation in $OUT, then is killed.
# tools/diag_nccl_graph_p2p.c (built by hand, see its header) runs too where staged.
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
if [ -x $here/bin/diag_nccl_graph_p2p ]; then
  for form in "threads plain" "threads graphmem"; do
    n=raw_${form// /_}
    $here/bin/diag_nccl_graph_p2p $form > $OUT/$n.txt 2>&1 & watch $n $!; tail -1 $OUT/$n.txt
  done
fi
for envs in ${DIAG_ENVS:-X=1 NCCL_RUNTIME_CONNECT=0}; do
  n=min_${envs%%=*}
  env $envs WEFT_TEST_VERBOSE=1 WEFT_TEST_FILTER="${DIAG_FILTER:-test_min_*}" \
    LD_PRELOAD=$here/lib/libstackdump.so STACKDUMP_FILE=$OUT/${n}_stacks.txt $here/bin/test_comm_long > $OUT/$n.txt 2>&1 &
  watch $n $!; grep -E "OK|FAIL|rank|error" $OUT/$n.txt | tail -8
done
