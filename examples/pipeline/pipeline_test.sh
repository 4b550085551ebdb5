#!/usr/bin/env bash
# Runs the pipeline example ($1) on the simulator; it checks its own output and the race oracle.
# A second run writes a trace with device timestamps and a memory snapshot: both must be valid
# JSON, the trace must have device slices on the three streams, and the snapshot the six buffers.
set -euo pipefail
WEFT_DRIVER=sim "$1"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
WEFT_DRIVER=sim WEFT_TRACE="$dir/trace.json" WEFT_TRACE_DEVICE=1 PIPELINE_SNAPSHOT="$dir/snapshot.json" "$1" >/dev/null
command -v python3 >/dev/null || { echo "no python3: the trace and snapshot are not checked"; exit 0; }
python3 - "$dir/trace.json" "$dir/snapshot.json" <<'PY'
import json, sys
trace = json.load(open(sys.argv[1]))
snap = json.load(open(sys.argv[2]))
device = {e["tid"] for e in trace if e.get("ph") == "X" and e.get("cat") == "device"}
assert device == {1000, 1001, 1002}, f"device tracks {sorted(device)}"
tags = sorted(b["tag"] for g in snap["segments"] for b in g["blocks"])
assert tags == ["chunk in"] * 3 + ["chunk out"] * 3, tags
print(f"trace: {len(trace)} events, device slices on streams 0-2; snapshot: {len(tags)} blocks")
PY
