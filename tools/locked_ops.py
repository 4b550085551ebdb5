#!/usr/bin/env python3
"""Locked read-modify-writes a hot path runs in weft's own code: atomic adds, exchanges and
compare-and-swaps (x86 `lock`-prefixed instructions and `xchg` with memory), per operation.

Each is a full barrier that drains the store buffer, tens of cycles where a plain add is one; the
mutexes weft takes are counted apart (tools/host_instr.sh: "mutex locks", each a locked
instruction to take and one to give back, inside the C library).

Reads a callgrind profile written with --dump-instr=yes --compress-pos=no --compress-strings=no
--dump-line=no (tools/host_instr.sh writes one per path) of BINARY (weft linked in statically),
finds BINARY's load address from its symbols, disassembles it (objdump) and sums the run counts
of its locked instructions, divided by OPS.
  tools/locked_ops.py PROFILE BINARY OPS [--list]
Prints "locked_per_op"; with --list, also each locked instruction's function and count per op.
"""
import argparse
import collections
import re
import subprocess

import callgrind_instr


def symbols(binary):
    out = subprocess.run(["nm", "--defined-only", binary], capture_output=True, text=True, check=True).stdout
    sym = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "tTwW":
            sym[parts[2]] = int(parts[0], 16)
    return sym


def locked(binary):
    """Address -> instruction text of every locked instruction in BINARY's code."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", binary], capture_output=True, text=True,
                         check=True).stdout
    found = {}
    for line in out.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+(.*)", line)
        if not m:
            continue
        text = m.group(2).strip()
        if text.startswith("lock ") or (text.startswith("xchg") and "(" in text):
            found[int(m.group(1), 16)] = text
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("profile")
    ap.add_argument("binary")
    ap.add_argument("ops", type=float)
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    name = a.binary.rsplit("/", 1)[-1]
    cost = collections.defaultdict(int)  # address -> run count, BINARY's object only
    first = {}  # function -> lowest address run
    for (ob, fn, addr), n in callgrind_instr.costs(a.profile).items():
        if ob.endswith("/" + name):
            cost[addr] += n
            first[fn] = min(first.get(fn, addr), addr)
    sym = symbols(a.binary)
    # The load address: the most common difference between a function's entry as run and its
    # symbol (a function run from its first instruction gives the exact one).
    bases = collections.Counter(first[f] - sym[f] for f in first if f in sym)
    if not bases:
        raise SystemExit("locked_ops: no function of %s in %s" % (name, a.profile))
    base = bases.most_common(1)[0][0]
    lk = locked(a.binary)
    total = 0
    rows = []
    for addr, n in cost.items():
        text = lk.get(addr - base)
        if text is not None:
            total += n
            rows.append((n, addr - base, text))
    print("%.2f" % (total / a.ops))
    if a.list:
        by_addr = sorted((v, k) for k, v in sym.items())
        for n, addr, text in sorted(rows, reverse=True):
            owner = max((s for s in by_addr if s[0] <= addr), default=(0, "?"))[1]
            print("  %6.2f  %-40s %s" % (n / a.ops, owner, text))


if __name__ == "__main__":
    main()
