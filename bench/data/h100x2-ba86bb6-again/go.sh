#!/bin/bash
# weft_bench's comm, tracker, replay and pipeline sections again, twice, to see how much of the
# final run's spread was the host (bench/data/h100x2-ba86bb6).
here=$(cd "$(dirname "$0")" && pwd)
export NCCL_SOCKET_IFNAME=lo
save=$OUT; R=/tmp/r; rm -rf $R; mkdir -p $R/1 $R/2
{ nvidia-smi -L; cat $here/COMMIT; lscpu | grep -E "Model name|^CPU\(s\)"; nvidia-smi --query-gpu=driver_version --format=csv,noheader; uptime; } > $R/machine.txt
for i in 1 2; do
  (cd $R/$i && OUT=$R/$i LD_LIBRARY_PATH=$here/lib $here/bin/weft_bench comm tracker replay pipeline > $R/$i/bench.txt 2>&1; echo "bench $i rc $?")
done
cp $R/1/../machine.txt $R/1/meta.txt 2>/dev/null
tar czf $save/r.tgz -C $R .
