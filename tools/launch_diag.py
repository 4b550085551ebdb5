#!/usr/bin/env python3
"""The launch diagnostics of weft_bench's tracker section, pooled over several runs: for each
kind of host work (weft's use around no work, register-only multiply-adds, 48 cache lines, two
mutex pairs, a cuCtxGetCurrent, 16 KiB of straight code), its time alone and what it adds to a raw
cuLaunchKernel when it runs just before one (per repetition: that row minus the raw launch of the
same repetition), as the median and interquartile range over every repetition of every run.

    tools/launch_diag.py DIR     (DIR holds tracker_<k>.csv, k = 1, 2, ...: weft_bench's CSV)"""
import collections
import csv
import glob
import statistics
import sys

RAW = "cuLaunchKernel, a raw stream"
ROWS = [
    ("use alone", "the same use around no work (weft's share, diagnostic)", False),
    ("multiply-adds alone", "100 dependent multiply-adds alone (diagnostic)", False),
    ("cache lines alone", "48 cache lines touched alone (diagnostic)", False),
    ("mutex pairs alone", "two mutex lock-unlock pairs alone (diagnostic)", False),
    ("16 KiB of code alone", "16 KiB of code run alone (diagnostic)", False),
    ("use, then launch", "that use around no work, then cuLaunchKernel on a raw stream (diagnostic)", True),
    ("multiply-adds, then launch", "100 dependent multiply-adds, then cuLaunchKernel (diagnostic)", True),
    ("cache lines, then launch", "48 cache lines touched, then cuLaunchKernel (diagnostic)", True),
    ("mutex pairs, then launch", "two mutex lock-unlock pairs, then cuLaunchKernel (diagnostic)", True),
    ("cuCtxGetCurrent, then launch", "cuCtxGetCurrent, then cuLaunchKernel (diagnostic)", True),
    ("16 KiB of code, then launch", "16 KiB of code run, then cuLaunchKernel (diagnostic)", True),
    ("weft_launch", "weft_launch, 1 access, a stream nobody waits on", True),
]


def summary(values):
    v = sorted(values)
    return "%7.0f  %7.0f..%-7.0f" % (statistics.median(v), v[len(v) // 4], v[3 * len(v) // 4])


def main():
    reps = collections.defaultdict(dict)
    for path in sorted(glob.glob(sys.argv[1] + "/tracker_*.csv")):
        for r in csv.DictReader(open(path)):
            if r["metric"] == "ns per launch":
                reps[(path, int(r["rep"]))][r["row"]] = float(r["value"])
    if not reps:
        sys.exit("launch_diag: no tracker_<k>.csv with launch rows in " + sys.argv[1])
    print("%d repetitions; raw cuLaunchKernel ns: %s" % (len(reps), summary([d[RAW] for d in reps.values()])))
    print("%-30s %-8s %s" % ("host work", "", "ns: median, interquartile range"))
    for name, row, minus_raw in ROWS:
        vals = [d[row] - (d[RAW] if minus_raw else 0) for d in reps.values() if row in d]
        if vals:
            print("%-30s %-8s %s" % (name, "over raw" if minus_raw else "alone", summary(vals)))


if __name__ == "__main__":
    main()
