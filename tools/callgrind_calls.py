#!/usr/bin/env python3
"""Calls that one object's functions make to the named functions, in a callgrind output file.

    callgrind_calls.py FILE OBJECT_SUBSTRING NAME [NAME ...]

Prints one count per NAME (a callee counts when its name starts with NAME). tools/host_instr.sh
uses it for the locks weft takes and the driver calls it makes per operation; the simulator's
own calls (its object is another) are left out."""
import re
import sys

path, want, wanted = sys.argv[1], sys.argv[2], sys.argv[3:]
names = {"ob": {}, "fn": {}}
cur_ob, cur_fn_ob, pending = "", "", None
totals = {w: 0 for w in wanted}


def name(kind, value):
    """Resolves callgrind's name compression: '(id) name' defines, '(id)' refers."""
    m = re.match(r"\((\d+)\)(?: (.*))?", value)
    if not m:
        return value
    if m.group(2) is not None:
        names[kind][m.group(1)] = m.group(2)
    return names[kind].get(m.group(1), "")


with open(path) as f:
    for line in f:
        line = line.rstrip("\n")
        if line.startswith("ob="):
            cur_ob = name("ob", line[3:])
        elif line.startswith("fn="):
            name("fn", line[3:])
            cur_fn_ob = cur_ob
        elif line.startswith("cob="):
            name("ob", line[4:])
        elif line.startswith("cfn="):
            pending = name("fn", line[4:])
        elif line.startswith("calls=") and pending is not None:
            if want in cur_fn_ob:
                for w in wanted:
                    if pending.startswith(w):
                        totals[w] += int(line[6:].split()[0])
            pending = None
print(" ".join(str(totals[w]) for w in wanted))
