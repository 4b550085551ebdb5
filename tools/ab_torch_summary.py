#!/usr/bin/env python3
"""Summary of a tools/run_ab_torch_gpu.sh run: per build, metric, stream and weft pair (the
adapter's, weft_alloc's), the median over rounds of each round's median ratio to PyTorch's pair
(each repeat against the PyTorch repeat beside it), with the rounds' range; and the same for ns.

    tools/ab_torch_summary.py DIR      (DIR holds <base|new>_<round>.csv)"""
import collections
import csv
import os
import re
import statistics
import sys

TORCH = "PyTorch caching allocator (raw_alloc_with_stream + raw_delete)"


def main():
    d = sys.argv[1]
    # (build, metric, stream, row) -> per round: (median ratio, median ns)
    per = collections.defaultdict(list)
    for name in sorted(os.listdir(d)):
        m = re.match(r"(base|new)_(\d+)\.csv$", name)
        if not m:
            continue
        build = m.group(1)
        samples = collections.defaultdict(dict)  # (metric, stream, row) -> rep -> value
        with open(os.path.join(d, name)) as f:
            for r in csv.DictReader(f):
                samples[(r["metric"], r["x"], r["row"])][int(r["rep"])] = float(r["value"])
        for (metric, stream, row), reps in samples.items():
            if row == TORCH:
                continue
            base = samples.get((metric, stream, TORCH), {})
            ratios = [v / base[k] for k, v in reps.items() if k in base and base[k] > 0]
            if ratios:
                per[(build, metric, stream, row)].append((statistics.median(ratios), statistics.median(reps.values())))
    print("| metric | stream | pair | build | rounds | ratio to PyTorch: median of rounds | range | ns: median | range |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for key in sorted(per, key=lambda k: (k[1], k[2], k[3], k[0])):
        build, metric, stream, row = key
        rs = [r for r, _ in per[key]]
        ns = [n for _, n in per[key]]
        short = "adapter" if "through the PyTorch adapter" in row else "weft_alloc (no adapter)"
        print("| %s | %s | %s | %s | %d | %.3f | %.3f-%.3f | %.1f | %.1f-%.1f |" %
              (metric, stream, short, build, len(rs), statistics.median(rs), min(rs), max(rs), statistics.median(ns),
               min(ns), max(ns)))


if __name__ == "__main__":
    main()
