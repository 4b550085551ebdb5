#!/usr/bin/env python3
"""What host work costs beside the driver's launches, from weft_bench CSVs (the replay section's
rows 'us per eager step, host work added before each launch', bench/bench_replay.c
eager_cost_model): per repetition, each row's step time minus the plain hand-placed step's measured
beside it, in ns per kernel (100 kernels a step) and per unit of the work added (a cache line
written, a locked add, an instruction); medians and ranges over every repetition of every CSV
given (pooled). With --path NAME=INSTRUCTIONS,LOCKED,LINES (tools/host_instr.sh's columns
"weft instructions", "locked RMWs", "lines, cold"; repeatable), what those counts would cost a
launch at the pooled prices (each unit priced by its larger row). Markdown on stdout.

    tools/cost_model.py BENCH_CSV [BENCH_CSV ...] [--path step=763,4.2,36.6 ...]"""
import argparse
import csv
import re
import statistics as st

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("csv", nargs="+")
ap.add_argument("--path", action="append", default=[], help="NAME=INSTRUCTIONS,LOCKED,LINES")
args = ap.parse_args()
BASE = "hand-placed events, 2 raw streams (100 cuLaunchKernel)"
METRIC = "us per eager step, host work added before each launch"
diffs, plain, order = {}, [], []
for path in args.csv:
    rows = {}
    for r in csv.DictReader(open(path)):
        if r["section"] == "replay" and r["metric"] == METRIC:
            rows.setdefault(r["row"], {})[int(r["rep"])] = float(r["value"])
    base = rows.pop(BASE)
    plain += base.values()
    for name, samples in rows.items():
        if name not in diffs:
            diffs[name] = []
            order.append(name)
        diffs[name] += [(samples[k] - base[k]) * 1000.0 / 100 for k in samples if k in base]
print("| host work before each launch | ns per kernel over the plain step: median (min to max) | ns per unit (median) | samples |")
print("| --- | ---: | ---: | ---: |")
price = {}
for name in order:
    m = re.search(r"\+ (\d+) (cache lines|locked adds|instructions)", name)
    units, what = int(m.group(1)), m.group(2)
    d = diffs[name]
    per = st.median(d) / units
    if what not in price or units > price[what][0]:
        price[what] = (units, per)
    print("| %d %s | %.1f (%.1f to %.1f) | %.3f per %s | %d |" % (units, what, st.median(d), min(d), max(d), per,
                                                                 what.rstrip("s"), len(d)))
print("\n%d CSVs; the plain step %.1f us (median of %d samples, %.1f-%.1f)." % (len(args.csv), st.median(plain),
                                                                                 len(plain), min(plain), max(plain)))
if args.path:
    pi, pr, pl = price["instructions"][1], price["locked adds"][1], price["cache lines"][1]
    print("\n| path | instructions | locked RMWs | lines, cold | predicted ns per launch: instructions + locked + lines | of the plain step's launch |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for spec in args.path:
        name, counts = spec.split("=")
        i, r, l = (float(x) for x in counts.split(","))
        total = i * pi + r * pr + l * pl
        print("| %s | %g | %g | %g | %.0f = %.0f + %.0f + %.0f | %.1f%% |" % (name, i, r, l, total, i * pi, r * pr, l * pl,
                                                                         100 * total / (st.median(plain) * 10)))
