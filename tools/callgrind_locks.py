#!/usr/bin/env python3
"""Calls to pthread_mutex_lock made from one object's functions, in a callgrind output file.

    callgrind_locks.py FILE OBJECT_SUBSTRING

(tools/host_instr.sh: the locks weft takes per operation; the simulator's own are left out.)"""
import re
import sys

path, want = sys.argv[1], sys.argv[2]
names = {"ob": {}, "fn": {}}
cur_ob, cur_fn_ob, pending, total = "", "", None, 0


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
            if pending.startswith("pthread_mutex_lock") and want in cur_fn_ob:
                total += int(line[6:].split()[0])
            pending = None
print(total)
