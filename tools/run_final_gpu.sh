#!/bin/bash
# The closing GPU run (on the 2-GPU kind, after tools/stage_gpu.sh): every staged binary (tests,
# conformance, examples, weft_bench's whole harness), the PyTorch example on both allocators,
# examples/torch/checks.py and the allocator pair, and data_parallel as two processes (200 steps).
# Prints a summary; everything goes to $OUT/r.tgz (kept under bench/data/).
#   run  command="bash stage/run_final_gpu.sh"  carry=["stage"]  kind=nvidia-h100-x2
here=$(cd "$(dirname "$0")" && pwd)
export NCCL_SOCKET_IFNAME=lo
save=$OUT; R=/tmp/r; rm -rf $R; mkdir -p $R
{ nvidia-smi -L; cat $here/COMMIT; lscpu | grep -E "Model name|^CPU\(s\)"; nvidia-smi --query-gpu=driver_version --format=csv,noheader; } > $R/machine.txt
OUT=$R bash $here/run_gpu.sh > $R/suite.txt 2>&1; echo "suite rc $?"; tail -1 $R/suite.txt
grep -E "FAIL" $R/suite.txt | head
(cd $R && OUT=$R bash $here/torch/run_torch_gpu.sh 60 200 > $R/torch_example.txt 2>&1; echo "torch rc $?")
grep -E "PASS|FAIL|^checks" $R/torch_example.txt | cut -c1-160 | head -12
cd $R
LD_LIBRARY_PATH=$here/lib $here/bin/data_parallel --steps 200 --rank 1 --world 2 --id-file $R/id > dp2_rank1.txt 2>&1 &
LD_LIBRARY_PATH=$here/lib $here/bin/data_parallel --steps 200 --rank 0 --world 2 --id-file $R/id > dp2_rank0.txt 2>&1
wait
for f in dp2_rank0.txt dp2_rank1.txt; do tail -n 2 $f; done
zcat -f $R/gpu_logs.txt | grep -E '^\[  SKIPPED \] [A-Za-z_]' | sort -u > $R/skipped.txt; wc -l < $R/skipped.txt
gzip $R/gpu_logs.txt
tar czf $save/r.tgz -C $R .
