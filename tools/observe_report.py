#!/usr/bin/env python3
"""The observability section of bench/RESULTS.md (issue 16), from a GPU run's files.

    python3 tools/observe_report.py GPU_OUT_DIR COMMIT > section.md

GPU_OUT_DIR holds what stage/run_observe_gpu.sh (and stage/run_gpu.sh) wrote: pipeline_trace.json
(WEFT_TRACE_DEVICE=1), pipeline_snapshot.json, pipeline.txt, nsys_nvtx.txt and suite.txt (its
first line names the card). It splits the pipeline's device slices into runs (gaps over 300 us),
gives each run's busy time and how much of it had two or more streams busy at once, and renders
with tools/weft_view_render.sh (headless Chromium) bench/img/pipeline_timeline.png (the second
three-stream run and the first one-stream run) and bench/img/pipeline_snapshot.png.
"""
import datetime
import json
import os
import statistics
import subprocess
import sys


def runs_of(slices, gap_us=300):
    slices = sorted(slices, key=lambda e: e["ts"])
    runs, cur = [], [slices[0]]
    for e in slices[1:]:
        if e["ts"] - max(x["ts"] + x["dur"] for x in cur) > gap_us:
            runs.append(cur)
            cur = [e]
        else:
            cur.append(e)
    runs.append(cur)
    return runs


def busy_and_overlap(run):
    edges = sorted([(e["ts"], 1) for e in run] + [(e["ts"] + e["dur"], -1) for e in run])
    k, last, busy, overlap = 0, edges[0][0], 0.0, 0.0
    for t, d in edges:
        if k >= 1:
            busy += t - last
        if k >= 2:
            overlap += t - last
        k += d
        last = t
    return busy, overlap


def main():
    src, commit = sys.argv[1], sys.argv[2]
    here = os.path.dirname(os.path.abspath(__file__))
    img = os.path.join(here, "..", "bench", "img")
    os.makedirs(img, exist_ok=True)
    trace = json.load(open(os.path.join(src, "pipeline_trace.json")))
    card = open(os.path.join(src, "suite.txt")).readline().strip().removeprefix("gpu: ")
    device = [e for e in trace if e.get("ph") == "X" and e.get("cat") == "device"]
    runs = runs_of(device)
    rows = []
    for i, r in enumerate(runs):
        busy, overlap = busy_and_overlap(r)
        streams = sorted({e["tid"] - 1000 for e in r})
        span = max(e["ts"] + e["dur"] for e in r) - min(e["ts"] for e in r)
        rows.append((i + 1, len(streams), len(r), span / 1e3, busy / 1e3, overlap / 1e3, 100 * overlap / busy))
    three = [r for r in runs if len({e["tid"] for e in r}) == 3]
    one = [r for r in runs if len({e["tid"] for e in r}) == 1]
    if len(three) < 2 or not one:
        sys.exit("observe_report: expected at least two three-stream runs and one one-stream run")
    render = os.path.join(here, "weft_view_render.sh")
    tmp = os.path.join(img, ".render")
    for name, run in (("pipeline_timeline_three", three[1]), ("pipeline_timeline_one", one[0])):
        lo = min(e["ts"] for e in run) - 20
        hi = max(e["ts"] + e["dur"] for e in run) + 20
        subprocess.run([render, tmp, os.path.join(src, "pipeline_trace.json"), "--window", f"{lo},{hi}",
                        "--size", "1000,1100"], check=True)
        os.replace(tmp + ".png", os.path.join(img, name + ".png"))
    subprocess.run([render, tmp, os.path.join(src, "pipeline_snapshot.json"), "--size", "1000,600"], check=True)
    os.replace(tmp + ".png", os.path.join(img, "pipeline_snapshot.png"))
    for ext in (".html", ".dom.html", ".browser.log"):
        if os.path.exists(tmp + ext):
            os.remove(tmp + ext)
    nsys = open(os.path.join(src, "nsys_nvtx.txt")).read().strip()
    out = [
        "## Seeing what weft does (issue 16): the pipeline's timeline with device timestamps",
        "",
        f"- card: **{card}**; date: {datetime.date.today().isoformat()}; commit: {commit}",
        "- command: `tools/stage_gpu.sh`, then on the GPU machine `bash stage/run_observe_gpu.sh` (the pipeline "
        "example with `WEFT_TRACE=... WEFT_TRACE_DEVICE=1 PIPELINE_SNAPSHOT=...`); this section and its pictures by "
        f"`python3 tools/observe_report.py OUT {commit}`",
        f"- Nsight Systems: {nsys.splitlines()[0] if nsys else 'not run'}; the trace's device timestamps stand in for it",
        "",
        "Each run of the pipeline (32 chunks: copy-in, compute, copy-out), from the trace's device slices "
        "(a pair of timing events around each use's work):",
        "",
        "| run | streams | device slices | span ms | busy ms | two or more streams busy, ms | share of busy time |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    out += [f"| {a} | {b} | {c} | {d:.3f} | {e:.3f} | {f:.3f} | {g:.1f}% |" for a, b, c, d, e, f, g in rows]
    med3 = statistics.median(r[6] for r in rows if r[1] == 3)
    out += [
        "",
        f"With three streams, two or more were busy at once for a median {med3:.1f}% of the busy time; with one, "
        "never (as it must be). The second three-stream run, then the first one-stream run, drawn by "
        "`tools/weft_view.html` (rows: host tracks per stream, then `stream S (device)`):",
        "",
        "![three streams](img/pipeline_timeline_three.png)",
        "",
        "![one stream](img/pipeline_timeline_one.png)",
        "",
        "The memory snapshot taken with all six buffers live (`weft_memory_snapshot`), in the viewer:",
        "",
        "![snapshot](img/pipeline_snapshot.png)",
        "",
        "```",
        open(os.path.join(src, "pipeline.txt")).read().strip(),
        "```",
    ]
    print("\n".join(out))


if __name__ == "__main__":
    main()
