#!/bin/bash
# Diagnostic on the GPU machine for threads that end after work on their per-thread streams:
# tools/diag_per_thread_exit.c's step sets, then test_adopt's and test_comm_long's thread cases
# with tools/stackdump.c preloaded; a run still going after 30 s gets the stacks of all its threads
# (symbolise here with addr2line against the same binaries) and is killed. Output in $OUT.
#   run  command="bash stage/diag_per_thread_gpu.sh"  carry=["stage"]  kind=nvidia-h200-x2
here=$(cd "$(dirname "$0")" && pwd)
export NCCL_SOCKET_IFNAME=lo LD_LIBRARY_PATH=$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
watch() { # name pid
  for i in $(seq 1 15); do sleep 2; kill -0 $2 2>/dev/null || break; done
  if kill -0 $2 2>/dev/null; then
    echo "$1: still running after 30 s"
    for t in /proc/$2/task/*; do echo "$t $(cat $t/comm) $(cat $t/wchan) $(cut -d' ' -f3 $t/stat)"; done > $OUT/$1_tasks.txt 2>&1
    kill -USR1 $2; sleep 2; kill -KILL $2
  fi
  wait $2; echo "$1 rc $?"
}
for steps in ${DIAG_STEPS:-wm wmr wmrs wmrp wmra wmrpq p a mp}; do
  timeout 25 $here/bin/diag_per_thread_exit $steps 20 > $OUT/raw_$steps.txt 2>&1; echo "raw $steps rc $?: $(tail -1 $OUT/raw_$steps.txt)"
done
n=adopt
WEFT_TEST_FILTER="${ADOPT_FILTER:-test_threads_that_come_and_go_reuse_the_slots_of_ended_ones}" \
  LD_PRELOAD=$here/lib/libstackdump.so STACKDUMP_FILE=$OUT/${n}_stacks.txt $here/bin/test_adopt > $OUT/$n.txt 2>&1 &
watch $n $!; tail -4 $OUT/$n.txt
n=comm_long
WEFT_TEST_VERBOSE=1 WEFT_TEST_SEEDS=1-2 WEFT_TEST_OPS=300 WEFT_TEST_RINGS=4,64 WEFT_TEST_FILTER=test_random_programs_thread_per_rank \
  LD_PRELOAD=$here/lib/libstackdump.so STACKDUMP_FILE=$OUT/${n}_stacks.txt $here/bin/test_comm_long > $OUT/$n.txt 2>&1 &
watch $n $!; tail -4 $OUT/$n.txt
