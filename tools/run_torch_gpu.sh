#!/usr/bin/env bash
# On a GPU machine with PyTorch (staged by tools/stage_gpu.sh into stage/torch/): the example on
# weft's allocator and on PyTorch's, compared (examples/torch/compare.py), the checks
# (examples/torch/checks.py), then the alloc+free
# benchmark in one process (bench/torch_pair.py): weft's adapter, weft_alloc + weft_free without it,
# and PyTorch's allocator. Results go to $OUT.
#   bash stage/torch/run_torch_gpu.sh [steps] [replays]
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-/tmp}"
steps="${1:-200}"
replays="${2:-1000}"
export WEFT_TORCH_LIB="$here/libweft_torch.so"
unset WEFT_DRIVER
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))' || exit 1
rc=0
python3 "$here/train.py" --allocator weft --steps "$steps" --replays "$replays" --out "$out/train_weft.json" || rc=1
python3 "$here/train.py" --allocator torch --steps "$steps" --replays "$replays" --out "$out/train_torch.json" || rc=1
python3 "$here/compare.py" "$out/train_weft.json" "$out/train_torch.json" || rc=1
# Shapes that broke weft before: a tensor from before a capture freed inside it; a capture forked
# onto a second stream; an allocation weft cannot make.
python3 "$here/checks.py" || rc=1
# The allocator pair, same size and mixed sizes; every repeat also into torch_bench.csv, which
# bench/results.py reads beside weft_bench's CSV (section alloc_torch).
rm -f "$out/torch_bench.csv"
python3 "$here/torch_pair.py" --weft "$here/libweft_torch.so" --bench "$here/libtorch_pair.so" --sizes 1M \
  --harness-csv "$out/torch_bench.csv" --metric "ns per pair, same 1 MiB" || rc=1
python3 "$here/torch_pair.py" --weft "$here/libweft_torch.so" --bench "$here/libtorch_pair.so" \
  --harness-csv "$out/torch_bench.csv" --metric "ns per pair, mixed sizes" || rc=1
exit $rc
