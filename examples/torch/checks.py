"""weft as PyTorch's allocator in the shapes that broke it before (each first a failing test on
the simulator, tests/torch):
  1. torch.cuda.graph where a tensor made before the capture dies inside it (`x = f(x)` with x
     from the warm-up): PyTorch frees it on the capturing stream; weft keeps that free until the
     capture has ended (weft_torch.h), then frees it;
  2. a capture forked onto a second stream (s2.wait_stream(cur) inside the graph, tensors made
     and freed on s2, cur.wait_stream(s2)): both streams allocate from the capture's one graph
     pool (weft joins s2 to the capture it met on cur, or the other way round);
  3. an allocation weft cannot make: PyTorch does not check what a pluggable allocator returns,
     so weft raises (RuntimeError with weft's message) instead of handing PyTorch a NULL tensor
     whose first kernel would fault the context; afterwards everything still works;
  4. (2 GPUs) a tensor of cuda:1 freed while cuda:0 is current: weft leaves the current device
     alone, so `device="cuda"` still means cuda:0 afterwards;
  5. tensor.record_stream(s) (what ProcessGroupNCCL does for every collective): a side stream
     still reading x (behind a 20 ms spin) when x dies on the default stream, whose next tensor of
     the same size gets x's memory and is overwritten at once: the side stream must read x's
     values, so the free waits for the recorded stream's work;
  6. torch.cuda.empty_cache(): weft gives back what it holds beyond live tensors (PyTorch's reset
     hook, unset before: empty_cache did nothing with weft's allocator);
  7. 100 graphs captured and deleted one after another (torch.compile's CUDA graphs make many):
     each graph's pool is given back when PyTorch releases it (the pool hooks; before, pools
     stayed until weft.release_graph_pools() and the 65th capture's allocations failed), and two
     graphs sharing a pool (pool=g1.pool()) share its memory and replay right.
Checks, with real PyTorch on a GPU: the captures end valid and replay right, no allocation or free
failed, the kept free was made after the capture, no byte of it stays live, and the impossible
allocation raises and leaves the device usable. Exits 1 when a check fails.

    python3 examples/torch/checks.py [--lib libweft_torch.so]
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
        sys.exit("checks.py: no CUDA device (this check needs a GPU and a CUDA build of PyTorch)")
    dev = torch.device("cuda", 0)
    n = 1 << 20
    side = torch.cuda.Stream()
    fails = []

    def check(what, ok):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            fails.append(what)

    # 1. A tensor from before the capture dies inside it.
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

    # 2. A capture forked onto a second stream.
    s2 = torch.cuda.Stream()
    a = torch.full((n,), 2.0, device=dev)
    torch.cuda.synchronize()
    f0 = weft.stats()
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2):
        cur = torch.cuda.current_stream()
        s2.wait_stream(cur)  # s2 joins the capture
        with torch.cuda.stream(s2):
            t = a * 3.0  # made on s2, inside
            u = t + 1.0
            del t  # dies on s2, inside
        cur.wait_stream(s2)
        out = u * 2.0  # made on the capturing stream after the fork
        del u
    f1 = weft.stats()
    check("the forked capture allocated and freed on both streams (alloc_failures %d -> %d, free_failures %d -> %d)"
          % (f0["alloc_failures"], f1["alloc_failures"], f0["free_failures"], f1["free_failures"]),
          f1["alloc_failures"] == f0["alloc_failures"] and f1["free_failures"] == f0["free_failures"])
    for r in range(3):
        a.fill_(float(r))
        g2.replay()
        torch.cuda.synchronize()
        want = (3.0 * r + 1.0) * 2.0
        check("replay %d of the forked capture: out = (3a + 1) * 2 = %g everywhere" % (r, want),
              bool(torch.all(out == want).item()))
    del g2, out, a
    torch.cuda.synchronize()
    weft.release_graph_pools()

    # 3. An allocation weft cannot make.
    o0 = weft.stats()
    try:
        torch.empty(1 << 46, dtype=torch.uint8, device=dev)  # 64 TiB
        raised = None
    except RuntimeError as e:
        raised = str(e)
    check("an impossible allocation raises RuntimeError naming weft's reason (%s)" % (raised or "nothing raised")[:160],
          raised is not None and "weft_torch: weft_alloc" in raised)
    o1 = weft.stats()
    check("it is counted once (alloc_failures %d -> %d)" % (o0["alloc_failures"], o1["alloc_failures"]),
          o1["alloc_failures"] == o0["alloc_failures"] + 1)
    v = torch.arange(1000, device=dev, dtype=torch.float32) * 2.0
    torch.cuda.synchronize()
    check("the device works afterwards (sum %g)" % v.sum().item(), v.sum().item() == 999000.0)
    del v

    # 4. A tensor of another device freed while this one is current.
    if torch.cuda.device_count() >= 2:
        torch.cuda.set_device(0)
        t1 = torch.ones(1 << 20, device="cuda:1")
        torch.cuda.synchronize(1)
        check("cuda:0 is current before the free (%d)" % torch.cuda.current_device(), torch.cuda.current_device() == 0)
        del t1  # freed with cuda:0 current
        check("cuda:0 is still current after freeing a cuda:1 tensor (%d)" % torch.cuda.current_device(),
              torch.cuda.current_device() == 0)
        e = torch.empty(16, device="cuda")
        check("device=\"cuda\" still means cuda:0 (%s)" % e.device, e.device == torch.device("cuda", 0))
        del e
    else:
        print("skip (one GPU): a tensor of cuda:1 freed while cuda:0 is current")

    # 5. record_stream.
    check("PyTorch's record_stream hook is set (weft.record_stream_hooked)", weft.record_stream_hooked)
    side5 = torch.cuda.Stream()
    x5 = torch.full((1 << 22,), 5.0, device=dev)
    torch.cuda.synchronize()
    r0 = weft.stats().get("streams_recorded", 0)
    with torch.cuda.stream(side5):
        torch.cuda._sleep(40_000_000)  # about 20 ms of spinning before the read
        y5 = x5 * 2.0
    x5.record_stream(side5)
    x5_ptr = x5.data_ptr()
    del x5  # dies on the default stream while side5 has yet to read it
    z5 = torch.empty((1 << 22,), device=dev)  # the same memory, from the default stream's cache
    z5.fill_(9.0)
    torch.cuda.synchronize()
    check("premise: the next tensor got x's memory (%#x, %#x)" % (x5_ptr, z5.data_ptr()), z5.data_ptr() == x5_ptr)
    check("record_stream was noted (streams_recorded %d -> %d)" % (r0, weft.stats().get("streams_recorded", 0)),
          weft.stats().get("streams_recorded", 0) == r0 + 1)
    check("the recorded stream read x before its memory was reused (y = %g, want 10)" % y5[0].item(),
          bool(torch.all(y5 == 10.0).item()))
    del y5, z5

    # 6. torch.cuda.empty_cache().
    check("PyTorch's reset hook is set (weft.empty_cache_hooked)", weft.empty_cache_hooked)
    big = [torch.empty(6 << 20, dtype=torch.uint8, device=dev) for _ in range(8)]
    del big
    torch.cuda.synchronize()
    r6 = weft.stats()["reserved_bytes"]
    torch.cuda.empty_cache()
    r7 = weft.stats()["reserved_bytes"]
    check("empty_cache gave memory back (reserved %d -> %d bytes)" % (r6, r7), r7 < r6)

    # 7. Many graphs, made and deleted; two graphs sharing a pool.
    check("PyTorch's graph-pool hooks are set (weft.graph_pools_hooked)", weft.graph_pools_hooked)
    a7 = torch.ones(1 << 18, device=dev)
    torch.cuda.synchronize()
    p0, k0 = weft.stats()["graph_pools"], weft.stats()["alloc_failures"]
    most, bad = 0, 0
    for i in range(100):
        g7 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g7):
            t7 = a7 * 2.0
            o7 = t7 + float(i)
            del t7
        g7.replay()
        torch.cuda.synchronize()
        bad += int(o7[0].item() != 2.0 + i)
        most = max(most, weft.stats()["graph_pools"])
        del g7, o7
    s7 = weft.stats()
    check("100 graphs captured, replayed right (%d wrong), no allocation failed (alloc_failures %d -> %d)"
          % (bad, k0, s7["alloc_failures"]), bad == 0 and s7["alloc_failures"] == k0)
    check("each graph's pool was given back when the graph died (at most %d held; now %d, before %d; %d bytes)"
          % (most, s7["graph_pools"], p0, s7["graph_pool_reserved"]), most <= p0 + 1 and s7["graph_pools"] == p0)
    g8 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g8):
        t8 = a7 * 3.0
        o8 = t8 + 1.0
        del t8
    r8 = weft.stats()["graph_pool_reserved"]
    g9 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g9, pool=g8.pool()):
        t9 = a7 * 5.0
        o9 = t9 + 1.0
        del t9
    s9 = weft.stats()
    check("two graphs sharing a pool hold one graph pool (%d, %d -> %d bytes)"
          % (s9["graph_pools"] - p0, r8, s9["graph_pool_reserved"]), s9["graph_pools"] == p0 + 1)
    a7.fill_(2.0)
    g8.replay()
    g9.replay()
    torch.cuda.synchronize()
    check("both replay right in capture order (%g, %g; want 7, 11)" % (o8[0].item(), o9[0].item()),
          o8[0].item() == 7.0 and o9[0].item() == 11.0)
    del g8, o8
    check("the shared pool stays while a graph uses it (%d)" % (weft.stats()["graph_pools"] - p0),
          weft.stats()["graph_pools"] == p0 + 1)
    g9.replay()
    torch.cuda.synchronize()
    check("the other graph still replays right (%g)" % o9[0].item(), o9[0].item() == 11.0)
    del g9, o9, a7
    check("and it is given back with the last graph (%d)" % (weft.stats()["graph_pools"] - p0),
          weft.stats()["graph_pools"] == p0)
    print("checks: %s" % ("FAILED: " + "; ".join(fails) if fails else "all checks passed"))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
