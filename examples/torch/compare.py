"""Compares two runs of examples/torch/train.py (--out files): weft's and PyTorch's allocator.

    python3 examples/torch/compare.py weft.json torch.json

Prints each criterion of issue 13 with the measured numbers and PASS/FAIL, and exits 1 if any
fails: losses equal to 1e-6 relative (eager and replayed), device memory held and peak reserved
at most 1.1 x PyTorch's, no growth of reserved memory after the first replay."""
import json
import sys


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    w, t = (json.load(open(p)) for p in sys.argv[1:3])
    rows = []

    def check(name, ok, detail):
        rows.append((name, "PASS" if ok else "FAIL", detail))

    for key in ("losses_eager", "losses_replay"):
        n = min(len(w[key]), len(t[key]))
        worst = max((rel(a, b) for a, b in zip(w[key][:n], t[key][:n])), default=float("nan"))
        check("%s equal (1e-6 relative)" % key, n > 0 and len(w[key]) == len(t[key]) and worst <= 1e-6,
              "%d losses, largest relative difference %.3g" % (n, worst))
    for key in ("device_memory_held", "peak_reserved"):
        ratio = w[key] / max(t[key], 1)
        check("%s <= 1.1 x PyTorch's" % key, ratio <= 1.1,
              "weft %.1f MiB, PyTorch %.1f MiB, ratio %.3f" % (w[key] / 2**20, t[key] / 2**20, ratio))
    grow = w["reserved_end"] - w["reserved_after_first_replay"]
    check("no reserved growth after the first replay (weft)", grow <= 0,
          "%.1f MiB after the first replay, %.1f MiB after %d replays"
          % (w["reserved_after_first_replay"] / 2**20, w["reserved_end"] / 2**20, w["replays"]))
    print("card: %s, torch %s" % (w["card"], w["torch"]))
    print("| | weft | PyTorch |\n| --- | --- | --- |")
    for key in ("eager_step_ms", "replay_step_ms"):
        print("| %s | %.3f | %.3f |" % (key, w[key], t[key]))
    print()
    print("| criterion | result | measured |\n| --- | --- | --- |")
    for r in rows:
        print("| %s | %s | %s |" % r)
    if "weft" in w:
        print("weft counters:", json.dumps(w["weft"]))
    sys.exit(0 if all(r[1] == "PASS" for r in rows) else 1)


if __name__ == "__main__":
    main()
