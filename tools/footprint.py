#!/usr/bin/env python3
"""Code footprint of a hot path: the distinct instructions and 64-byte cache lines of code it runs.

Reads a callgrind profile written with --dump-instr=yes --compress-pos=no --compress-strings=no
--dump-line=no (tools/host_instr.sh writes one per path) and counts, per object and function, the
instruction addresses run at least `min` times (the path's count: code every operation runs, not
its warm-up or rare branches) and the 64-byte cache lines they lie in. What a use costs on a GPU
host grows with this footprint (bench/data/h100x1-bb56c9c).
  tools/footprint.py PROFILE MIN [--object SUBSTRING] [--top K] [--total]
With --total, prints only "instructions lines" of all the functions counted.
"""
import argparse
import collections

import callgrind_instr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("profile")
    ap.add_argument("min", type=int)
    ap.add_argument("--object", default="")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--total", action="store_true")
    a = ap.parse_args()
    cost = callgrind_instr.costs(a.profile)  # (object, function, address) -> instructions run
    per_fn = collections.defaultdict(set)
    for (o, fname, addr), n in cost.items():
        if n >= a.min and a.object in o:
            per_fn[(o.rsplit("/", 1)[-1], fname)].add(addr)
    lines = {(o, ad >> 6) for (o, _), addrs in per_fn.items() for ad in addrs}
    total = sum(len(v) for v in per_fn.values())
    if a.total:
        print(total, len(lines))
        return
    print(f"| function | object | instructions | lines |")
    print(f"| --- | --- | ---: | ---: |")
    rows = sorted(per_fn.items(), key=lambda kv: -len(kv[1]))
    for (o, fname), addrs in rows[: a.top]:
        print(f"| {fname} | {o} | {len(addrs)} | {len({ad >> 6 for ad in addrs})} |")
    print(f"| all ({len(per_fn)} functions) | | {total} | {len(lines)} |")


if __name__ == "__main__":
    main()
