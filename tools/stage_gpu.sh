#!/usr/bin/env bash
# Builds every GPU-capable target (tests, examples and benchmarks tagged "gpu") as
# self-contained binaries and copies them, with libcmocka.so.0 and tools/run_gpu.sh, into
# stage/ (git-ignored). Then, with the device tool:  run  command="bash stage/run_gpu.sh"
# carry=["stage"].
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
targets=$(bazel query 'attr(tags, "\bgpu\b", //...)' 2>/dev/null | sort)
[ -n "$targets" ] || { echo "no target is tagged gpu" >&2; exit 1; }
# Static linking of weft's own libraries: the binaries need only the system's and cmocka.
bazel build --dynamic_mode=off -c opt $targets
rm -rf stage
mkdir -p stage/bin stage/lib
for t in $targets; do
  pkg=${t#//}; pkg=${pkg%%:*}; name=${t##*:}
  cp "bazel-bin/$pkg/$name" "stage/bin/$name"
done
cp -L "$(ldconfig -p | awk '/libcmocka.so.0 /{print $NF; exit}')" stage/lib/libcmocka.so.0
cp tools/run_gpu.sh tools/run_final_gpu.sh tools/run_observe_gpu.sh tools/run_thread_gate_gpu.sh tools/run_gate_scope_gpu.sh tools/diag_comm_long_gpu.sh stage/
# PyTorch's side (issue 13): the adapter, its Python helper, the example and the allocator benchmark.
bazel build -c opt //lib/torch:libweft_torch.so //bench:libtorch_pair.so //tests/torch:libc10_stub.so
mkdir -p stage/torch
cp bazel-bin/lib/torch/libweft_torch.so bazel-bin/bench/libtorch_pair.so bazel-bin/tests/torch/libc10_stub.so stage/torch/
cp lib/torch/weft_torch.py examples/torch/train.py examples/torch/compare.py examples/torch/checks.py bench/torch_pair.py tools/run_torch_gpu.sh \
  stage/torch/
chmod u+w stage/torch/*
# The commit the binaries come from (run_gpu.sh writes it into $OUT/meta.txt for bench/results.py).
commit=$(git rev-parse --short HEAD)
git diff --quiet HEAD -- . ':!stage' || commit="$commit-dirty"
echo "$commit" > stage/COMMIT
echo "staged $(ls stage/bin | wc -l) binaries in stage/ ($(du -sh stage | cut -f1))"
