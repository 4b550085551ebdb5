"""weft's PyTorch adapter against PyTorch's own caching allocator: host ns per alloc + free pair,
timed in C (libtorch_pair.so, bench/torch_pair.c) in this one process and run, allocators
interleaved repeat by repeat (weft, PyTorch, weft_alloc, weft, PyTorch, ...): weft's adapter,
PyTorch's allocator, and weft_alloc + weft_free (weft.h) of the same library without the adapter,
on the same stream (issue 17's goal names that pair; the adapter adds its own calls).

    python3 bench/torch_pair.py --weft stage/torch/libweft_torch.so --bench stage/torch/libtorch_pair.so

PyTorch's allocator is left as it is (this script never changes it): `import torch` and a first
CUDA tensor initialise it, and libtorch_pair.so reaches it in the already loaded libc10_cuda.so.
weft's side is weft_torch_alloc / weft_torch_free called directly (as CUDAPluggableAllocator
would), not installed into PyTorch. Both run on the current stream (PyTorch's default: the legacy
NULL stream) and then on a torch.cuda.Stream() side stream. Prints a markdown table; writes the
same rows to $OUT/torch_pair.csv when OUT is set. Exits non-zero when torch or CUDA is missing or
an allocator could not be timed.
"""
import argparse
import csv
import ctypes
import datetime
import os
import statistics
import sys

DEFAULT_SIZES = "512,4096,65536,1M,4M"  # a PyTorch-like mix: small pool and large pool blocks


def parse_sizes(text):
    """'512,4K,1M' -> [512, 4096, 1048576] (K and M are binary)."""
    sizes = []
    for item in text.split(","):
        item = item.strip().upper()
        scale = {"K": 1 << 10, "M": 1 << 20}.get(item[-1:], 1)
        n = int(item[:-1] if scale > 1 else item) * scale
        if n <= 0:
            raise argparse.ArgumentTypeError("sizes must be > 0: %r" % text)
        sizes.append(n)
    return sizes


def die(msg, code=2):
    print("torch_pair: " + msg, file=sys.stderr)
    sys.exit(code)


def load_bench(path):
    lib = ctypes.CDLL(os.path.abspath(path))
    f = lib.torch_pair_run
    f.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p,
                  ctypes.POINTER(ctypes.c_size_t), ctypes.c_int, ctypes.c_int, ctypes.c_int,
                  ctypes.c_int, ctypes.POINTER(ctypes.c_double), ctypes.c_int]
    f.restype = ctypes.c_int
    lib.torch_pair_last_error.restype = ctypes.c_char_p
    lib.torch_pair_torch_how.restype = ctypes.c_char_p
    return lib


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weft", default="stage/torch/libweft_torch.so", help="libweft_torch.so")
    ap.add_argument("--bench", default="stage/torch/libtorch_pair.so", help="libtorch_pair.so")
    ap.add_argument("--c10", default=None,
                    help="libc10_cuda.so as loaded by torch (default: torch/lib/libc10_cuda.so)")
    ap.add_argument("--pairs", type=int, default=2000,
                    help="rounds of the size list per timed loop (default 2000)")
    ap.add_argument("--repeats", type=int, default=7, help="timed loops per allocator (default 7)")
    ap.add_argument("--sizes", type=parse_sizes, default=parse_sizes(DEFAULT_SIZES),
                    help="bytes, comma-separated, K/M suffixes (default %s)" % DEFAULT_SIZES)
    ap.add_argument("--harness-csv", default=None,
                    help="also append every repeat to this CSV in weft_bench's format (section alloc_torch; "
                         "bench/results.py reads it), creating it with its header")
    ap.add_argument("--metric", default="ns per pair, mixed sizes",
                    help="the metric name of those rows (default: 'ns per pair, mixed sizes')")
    args = ap.parse_args()
    if args.pairs < 1 or args.repeats < 1:
        die("--pairs and --repeats must be >= 1")
    for p in (args.weft, args.bench):
        if not os.path.isfile(p):
            die("no such file: %s" % p)

    try:
        import torch
    except ImportError as e:
        die("PyTorch is not installed here (%s): run this on the GPU machine" % e)
    if not torch.cuda.is_available():
        die("torch %s sees no CUDA device (torch.version.cuda = %s)" % (torch.__version__, torch.version.cuda))
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # initialises PyTorch's caching allocator on this device
    device = torch.cuda.current_device()
    backend = torch.cuda.get_allocator_backend() if hasattr(torch.cuda, "get_allocator_backend") else "?"
    c10 = args.c10 or os.path.join(os.path.dirname(torch.__file__), "lib", "libc10_cuda.so")
    if not os.path.isfile(c10):
        c10 = None  # libtorch_pair.so then tries the soname

    lib = load_bench(args.bench)
    sizes = (ctypes.c_size_t * len(args.sizes))(*args.sizes)
    side = torch.cuda.Stream()
    streams = [("current (%s)" % (torch.cuda.current_stream().cuda_stream or "legacy NULL"),
                torch.cuda.current_stream().cuda_stream),
               ("side torch.cuda.Stream()", side.cuda_stream)]
    rows, failed, how, samples = [], [], "", []
    for stream_name, handle in streams:
        out = (ctypes.c_double * (NAMES_N * args.repeats))()
        torch.cuda.synchronize()
        rc = lib.torch_pair_run(args.weft.encode(), c10.encode() if c10 else None, device, handle or None,
                                sizes, len(args.sizes), args.pairs, args.repeats, 7, out, len(out))
        torch.cuda.synchronize()
        how = lib.torch_pair_torch_how().decode() or how
        if rc != 7:
            failed.append("%s: %s" % (stream_name, lib.torch_pair_last_error().decode() or "rc %d" % rc))
        med = {}
        for k, alloc in enumerate(NAMES):
            ns = [out[NAMES_N * r + k] for r in range(args.repeats)]
            if rc < 0 or not rc & (1 << k):
                continue
            med[alloc] = statistics.median(ns)
            samples += [(alloc, stream_name, r, v) for r, v in enumerate(ns)]
            rows.append({"allocator": alloc, "stream": stream_name, "median_ns": med[alloc],
                         "min_ns": min(ns), "max_ns": max(ns), "ratio": None,
                         "repeats_ns": ";".join("%.1f" % x for x in ns)})
        for row in rows:
            if row["stream"] == stream_name and row["allocator"] != "PyTorch" and "PyTorch" in med:
                row["ratio"] = med[row["allocator"]] / med["PyTorch"]

    date = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    card = torch.cuda.get_device_name(device)
    print("## weft vs PyTorch's caching allocator: alloc + free pair, host ns\n")
    print("- card: %s (device %d); torch %s (CUDA %s); allocator backend: %s" %
          (card, device, torch.__version__, torch.version.cuda, backend))
    print("- date: %s" % date)
    print("- sizes: %s bytes, %d rounds per timed loop, %d repeats per allocator (interleaved), "
          "median / min / max over the repeats" % (",".join(map(str, args.sizes)), args.pairs, args.repeats))
    print("- PyTorch reached by: %s\n" % (how or "(not reached)"))
    print("| allocator | stream | median ns/pair | min | max | weft / PyTorch (median) |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print("| %s | %s | %.1f | %.1f | %.1f | %s |" % (r["allocator"], r["stream"], r["median_ns"], r["min_ns"],
                                                     r["max_ns"], "%.2f" % r["ratio"] if r["ratio"] else "-"))
    if os.environ.get("OUT"):
        path = os.path.join(os.environ["OUT"], "torch_pair.csv")
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["allocator", "stream", "median_ns", "min_ns", "max_ns", "ratio_weft_over_pytorch",
                        "repeats_ns", "card", "torch", "cuda", "backend", "date", "sizes", "pairs", "repeats"])
            for r in rows:
                w.writerow([r["allocator"], r["stream"], "%.1f" % r["median_ns"], "%.1f" % r["min_ns"],
                            "%.1f" % r["max_ns"], "%.3f" % r["ratio"] if r["ratio"] else "", r["repeats_ns"],
                            card, torch.__version__, torch.version.cuda, backend, date,
                            ";".join(map(str, args.sizes)), args.pairs, args.repeats])
        print("\n(CSV: %s)" % path)
    if args.harness_csv:
        write_harness(args.harness_csv, args.metric, samples)
        print("(samples appended to %s)" % args.harness_csv)
    if failed:
        die("not every allocator was timed: " + " | ".join(failed), 1)


# The allocators torch_pair_run times, in its order (its out_ns[3 * r + k]).
NAMES = ("weft", "PyTorch", "weft_alloc")
NAMES_N = len(NAMES)

# The rows in weft_bench's CSV (bench/report.c): weft's pairs compared with PyTorch's, each repeat
# a sample (interleaved), the stream as x.
WEFT_ROW = "weft_alloc + weft_free through the PyTorch adapter (weft_torch_alloc / weft_torch_free)"
DIRECT_ROW = "weft_alloc + weft_free on PyTorch's stream, without the adapter (weft.h)"
TORCH_ROW = "PyTorch caching allocator (raw_alloc_with_stream + raw_delete)"
ROW_OF = {"weft": WEFT_ROW, "weft_alloc": DIRECT_ROW, "PyTorch": TORCH_ROW}


def write_harness(path, metric, samples):
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(["section", "row", "metric", "unit", "baseline", "x", "rep", "value", "machine"])
        for alloc, stream, rep, value in samples:
            base = TORCH_ROW if alloc != "PyTorch" else ""
            w.writerow(["alloc_torch", ROW_OF[alloc], metric, "ns", base, stream, rep, "%.9g" % value, "gpu"])


if __name__ == "__main__":
    main()
