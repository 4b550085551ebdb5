"""Prints summary.md from run1/ and run2/ (python3 summarize.py > summary.md, in this folder)."""
import glob
import re
import statistics as st

print("| run | round | build | typical iteration weft / raw | weft - raw, ns | bookkeeping after NCCL - raw, ns "
      "| one group, us per all-reduce ratio (median of 15) | thread per rank ratio |")
print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
agg = {}
for run in ("run1", "run2"):
    rounds = sorted({int(re.search(r"_(\d+)\.txt", f).group(1)) for f in glob.glob(run + "/ab_*_*.txt")})
    for r in rounds:
        for v in ("base", "new"):
            t = open(f"{run}/ab_{v}_{r}.txt").read()
            m = re.search(r"weft / raw ([\d.]+), weft - raw (-?\d+) ns; .* after raw NCCL's group (-?\d+) ns", t)
            rows = [l for l in t.splitlines() if l.startswith("| 1048576 |")]
            g, th = rows[0].split("|")[4].strip(), rows[1].split("|")[4].strip()
            print(f"| {run} | {r} | {v} | {m.group(1)} | {m.group(2)} | {m.group(3)} | {g} | {th} |")
            for k, x in zip(("tr", "td", "bk", "g", "th"), (m.group(1), m.group(2), m.group(3), g, th)):
                agg.setdefault((v, k), []).append(float(x))
print()
print("Medians over all 9 rounds (base / new): typical-iteration ratio %.3f / %.3f; weft - raw %.0f / %.0f ns; "
      "bookkeeping after NCCL %.0f / %.0f ns; one-group ratio %.3f / %.3f; thread-per-rank ratio %.3f / %.3f."
      % tuple(x for k in ("tr", "td", "bk", "g", "th") for x in (st.median(agg[("base", k)]), st.median(agg[("new", k)]))))
