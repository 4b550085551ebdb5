#!/usr/bin/env python3
"""Shrinks a scale-gate trace to a short reproducer (delta debugging over its lines).

  WEFT_TEST_SEEDS=2 WEFT_TEST_OPS=1550 WEFT_TEST_STOP=1 WEFT_TEST_TRACE=0 <scale_quick> 2> t.trace
  WEFT_EVENT_RING=64 tools/scale_shrink.py t.trace [--match REGEX] [--out small.trace]

Lines of one generator op (same "op N") are kept or deleted together, so that what the generator
did within one op (WEFT_TEST_SAFE_CAPTURE's synchronise-begin-join, alloc-then-fill) stays whole;
--lines deletes single lines. A candidate "still fails" when //tests/scale:replay reports races (and, with --match, one of the
printed races matches REGEX). Runtime options come from the environment (WEFT_EVENT_RING,
WEFT_OUTPUT_POLICY, WEFT_SIM_LAZY, WEFT_SIM_SEED). Build first:
  bazel build -c opt //tests/scale:replay
"""
import argparse, os, re, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--match", default=None, help="regex a reported race must match")
    ap.add_argument("--out", default=None)
    ap.add_argument("--lines", action="store_true", help="shrink single lines, not whole ops")
    ap.add_argument("--replay", default=os.path.join(ROOT, "bazel-bin/tests/scale/replay"))
    a = ap.parse_args()
    raw = [l for l in open(a.trace) if l.startswith("op ")]
    lines = []  # units: lists of lines
    for l in raw:
        key = l.split(":", 1)[0]
        if not a.lines and lines and lines[-1][0].split(":", 1)[0] == key:
            lines[-1].append(l)
        else:
            lines.append([l])
    env = dict(os.environ)
    env.setdefault("WEFT_DRIVER", "sim")
    env["RUNFILES_DIR"] = a.replay + ".runfiles"
    tmp = tempfile.NamedTemporaryFile("w", suffix=".trace", delete=False).name
    runs = [0]

    def fails(ls):
        runs[0] += 1
        with open(tmp, "w") as f:
            for u in ls:
                f.writelines(u)
        try:
            p = subprocess.run([a.replay, tmp], env=env, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            return False
        if p.returncode != 1:
            return False
        return a.match is None or re.search(a.match, p.stdout) is not None

    if not fails(lines):
        sys.exit("the full trace does not fail under replay")
    n = 2
    while len(lines) >= 2:
        chunk = max(1, len(lines) // n)
        removed = False
        for start in range(0, len(lines), chunk):
            cand = lines[:start] + lines[start + chunk:]
            if cand and fails(cand):
                lines = cand
                n = max(n - 1, 2)
                removed = True
                break
        if not removed:
            if chunk == 1:
                break
            n = min(len(lines), n * 2)
        print(f"  {len(lines)} ops ({runs[0]} replays)", file=sys.stderr)
    out = a.out or a.trace + ".min"
    flat = [l for u in lines for l in u]
    with open(out, "w") as f:
        f.writelines(flat)
    print(f"{len(flat)} lines in {out} ({runs[0]} replays):")
    sys.stdout.writelines(flat)
    fails(lines)
    p = subprocess.run([a.replay, out], env=env, capture_output=True, text=True)
    print(p.stdout, end="")


if __name__ == "__main__":
    main()
