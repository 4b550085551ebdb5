#!/usr/bin/env bash
# An interleaved A/B of two builds of the PyTorch adapter's pair on the GPU machine (PyTorch
# there): bench/torch_pair.py times weft's adapter, weft_alloc + weft_free without it and
# PyTorch's caching allocator in one process, on the legacy stream and a side stream; this runs
# it for each build in turn, round after round, same 1 MiB then mixed sizes. Staged as
# stage/ab_torch/{base,new}/libweft_torch.so beside libtorch_pair.so, torch_pair.py and this:
#   ROUNDS=5 AB_LIMIT=300 bash stage/ab_torch/run_ab_torch_gpu.sh
# Each round's samples go to $OUT/ab_torch/ab_<build>_<round>.csv (torch_pair.py's harness CSV,
# named as tools/ab_bench.sh names weft_bench's), everything to $OUT/ab_torch.tgz; summarise with
# python3 tools/ab_summary.py FOLDER.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$OUT/ab_torch"
nvidia-smi --query-gpu=name,driver_version,uuid --format=csv,noheader > "$OUT/ab_torch/machine.txt" 2>&1
lscpu | grep -E "Model name|^CPU\(s\)" >> "$OUT/ab_torch/machine.txt" 2>&1
python3 -c 'import torch; print("torch", torch.__version__)' >> "$OUT/ab_torch/machine.txt" 2>&1
end=$((SECONDS + ${AB_LIMIT:-300}))
for round in $(seq 1 "${ROUNDS:-5}"); do
  for build in base new; do
    [ $SECONDS -lt $end ] || break 2
    csv="$OUT/ab_torch/ab_${build}_${round}.csv"
    python3 "$here/torch_pair.py" --weft "$here/$build/libweft_torch.so" --bench "$here/libtorch_pair.so" --sizes 1M \
      --harness-csv "$csv" --metric "ns per pair, same 1 MiB" >> "$OUT/ab_torch/ab_${build}_${round}.txt" 2>&1
    python3 "$here/torch_pair.py" --weft "$here/$build/libweft_torch.so" --bench "$here/libtorch_pair.so" \
      --harness-csv "$csv" --metric "ns per pair, mixed sizes" >> "$OUT/ab_torch/ab_${build}_${round}.txt" 2>&1
  done
done
tar czf "$OUT/ab_torch.tgz" -C "$OUT/ab_torch" . && rm -rf "$OUT/ab_torch"
