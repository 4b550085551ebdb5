"""Per-instruction run counts from a callgrind profile written with --dump-instr=yes
--compress-pos=no --compress-strings=no --dump-line=no (tools/host_instr.sh writes one per path):
the reader tools/footprint.py and tools/locked_ops.py share."""
import collections


def costs(profile):
    """{(object, function, address): instructions run there}; a call's inclusive cost is left out."""
    cost = collections.defaultdict(int)
    ob = fn = ""
    skip = False
    with open(profile) as f:
        for line in f:
            if skip:  # the line after calls= is the call's inclusive cost
                skip = False
                continue
            if line.startswith("ob="):
                ob = line[3:].strip()
            elif line.startswith("fn="):
                fn = line[3:].strip()
            elif line.startswith("calls="):
                skip = True
            elif line.startswith("0x"):
                addr, n = line.split()[:2]
                cost[(ob, fn, int(addr, 16))] += int(n)
    return cost
