#!/usr/bin/env python3
"""Summary of a tools/ab_bench.sh run: for each round and build, the median over repetitions of
each key row's ratio to its baseline (the repetition's own baseline sample), then of its value;
then per build the median (and range) of those over the rounds. Reads weft_bench's CSVs
(tools/ab_bench.sh) and bench/torch_pair.py's (tools/run_ab_torch_gpu.sh) alike.

    tools/ab_summary.py DIR      (DIR holds ab_<base|new>_<round>.csv or .csv.gz)"""
import gzip
import os
import collections
import csv
import statistics
import sys
d = sys.argv[1]
rows_of_interest = [
 ("alloc", "`pool` resource alone (weft_resource_allocate + deallocate)", "ns per pair, same 1 MiB", "POOL"),
 ("alloc", "`pool` resource alone (weft_resource_allocate + deallocate)", "ns per pair, mixed sizes", "POOL"),
 ("alloc", "weft_alloc + weft_free, memory = POOL", "ns per pair, same 1 MiB", "POOL"),
 ("comm", "weft_all_reduce, one weft group", "us per all-reduce", "1048576"),
 ("comm", "weft_all_reduce, one weft group", "host us to enqueue", "1048576"),
 ("comm", "weft_all_reduce, a thread per rank", "us per all-reduce", "1048576"),
 ("tracker", "no edge, 1 access", "ns per use, begin+end", ""),
 ("tracker", "no edge, 4 accesses", "ns per use, begin+end", ""),
 ("tracker", "no edge, 16 accesses", "ns per use, begin+end", ""),
 ("tracker", "no edge, 1 access, a stream others wait on", "ns per use, begin+end", ""),
 ("tracker", "one edge (write after write, 2 streams)", "ns per use, begin+end", ""),
 ("tracker", "weft_launch, 1 access, a stream nobody waits on", "ns per launch", ""),
 ("tracker", "that use around no work, then cuLaunchKernel on a raw stream (diagnostic)", "ns per launch", ""),
 ("replay", "weft eager, 2 streams (100 weft_launch)", "us per eager step, an edge every 10 kernels", ""),
]
# bench/torch_pair.py's rows (tools/run_ab_torch_gpu.sh): each weft pair against PyTorch's beside it.
for _metric in ("ns per pair, same 1 MiB", "ns per pair, mixed sizes"):
    for _x in ("current (legacy NULL)", "side torch.cuda.Stream()"):
        for _row in ("weft_alloc + weft_free through the PyTorch adapter (weft_torch_alloc / weft_torch_free)",
                     "weft_alloc + weft_free on PyTorch's stream, without the adapter (weft.h)"):
            rows_of_interest.append(("alloc_torch", _row, _metric, _x))
def load(path):
    v = collections.defaultdict(dict)
    f = open(path) if os.path.exists(path) else gzip.open(path + ".gz", "rt")
    for r in csv.DictReader(f):
        v[(r["section"], r["row"], r["metric"], r["x"])][int(r["rep"])] = (float(r["value"]), r["baseline"])
    return v
rounds = sorted({int(n.split("_")[2].split(".")[0]) for n in os.listdir(d) if n.startswith("ab_new_") and ".csv" in n})
present = set()
for rnd in rounds:
    for v in ("base", "new"):
        present |= set(load(f"{d}/ab_{v}_{rnd}.csv"))
rows_of_interest = [r for r in rows_of_interest if r in present]
def ratio_cell(data, key):
    """The median over repetitions of the row's ratio to the repetition's own baseline sample."""
    ratios = []
    for rep, (val, base) in data.get(key, {}).items():
        b = data.get((key[0], base, key[2], key[3]), {}).get(rep)
        if b: ratios.append(val / b[0])
    return f"{statistics.median(ratios):.3f}" if ratios else "-"
def value_cell(data, key):
    """The median over repetitions of the row's value."""
    vals = [val for val, _ in data.get(key, {}).values()]
    return f"{statistics.median(vals):.2f}" if vals else "-"
for title, cell in (("ratio to its baseline", ratio_cell), ("median value", value_cell)):
    if cell is value_cell: print()
    print("| round | build | " + " | ".join(f"{r[1]} ({r[2]}{', x = ' + r[3] if r[3] else ''}), {title}" for r in rows_of_interest) + " |")
    print("| --- | --- |" + " ---: |" * len(rows_of_interest))
    cells = {}
    for rnd in rounds:
        for v in ("base", "new"):
            data = load(f"{d}/ab_{v}_{rnd}.csv")
            cells[(rnd, v)] = [cell(data, key) for key in rows_of_interest]
            print(f"| {rnd} | {v} | " + " | ".join(cells[(rnd, v)]) + " |")
    for v in ("base", "new"):  # the median over the rounds of each round's median
        col = [[float(cells[(rnd, v)][i]) for rnd in rounds if cells[(rnd, v)][i] != "-"]
               for i in range(len(rows_of_interest))]
        print(f"| median of rounds | {v} | " +
              " | ".join(f"{statistics.median(c):.3f} ({min(c):.3f}-{max(c):.3f})" if c else "-" for c in col) + " |")
