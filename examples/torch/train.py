"""Train a small MLP with Adam: N eager steps (a side stream prefetches the next batch), then one
step captured with torch.cuda.graph and replayed M times. --allocator weft installs weft as
PyTorch's CUDA allocator (lib/torch/weft_torch.py); --allocator torch keeps PyTorch's own.

Prints the losses, the step time eager and replayed, peak reserved memory and the device memory
the run holds, and weft's counters; --out FILE writes the same as JSON (examples/torch/compare.py
compares two runs).

    python3 examples/torch/train.py --allocator weft --out /tmp/weft.json
    python3 examples/torch/train.py --allocator torch --out /tmp/torch.json
    python3 examples/torch/compare.py /tmp/weft.json /tmp/torch.json

With weft the side stream's prefetch is declared (weft.use): the main stream waits for it because
weft says so, and the batch is freed on the side stream with no record_stream. With PyTorch's
allocator the same script uses wait_stream and record_stream, as PyTorch requires.
"""
import argparse
import json
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--allocator", choices=["weft", "torch"], default="weft")
    ap.add_argument("--steps", type=int, default=200, help="eager steps")
    ap.add_argument("--replays", type=int, default=1000, help="replays of the captured step")
    ap.add_argument("--checked", type=int, default=200, help="replays whose loss is read back")
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--lib", default=None, help="libweft_torch.so (default: $WEFT_TORCH_LIB or next to weft_torch.py)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here, os.path.join(here, "..", "..", "lib", "torch")]  # staged together, or in the tree
    use_weft = a.allocator == "weft"
    if use_weft:
        import weft_torch as weft

        weft.install(a.lib)  # before anything touches CUDA memory
    import torch

    if not torch.cuda.is_available():
        sys.exit("train.py: no CUDA device (this example needs a GPU and a CUDA build of PyTorch)")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda", 0)
    free0, total = torch.cuda.mem_get_info(dev)

    torch.manual_seed(0)
    layers = []
    for i in range(a.layers):
        layers += [torch.nn.Linear(a.dim, a.dim), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers[:-1], torch.nn.Linear(a.dim, 1)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, capturable=True)
    gen = torch.Generator(device=dev)
    gen.manual_seed(1)
    main_stream = torch.cuda.current_stream(dev)
    side = torch.cuda.Stream(dev)
    w_true = torch.randn(a.dim, 1, device=dev, generator=gen) / a.dim**0.5
    # The side stream reads w_true; no allocator (weft's included) knows the kernels PyTorch ran
    # on it, so its writes must be complete first.
    torch.cuda.synchronize()

    def make_batch(stream):
        """The next batch, made on `stream` (the prefetch)."""
        if use_weft:
            with torch.cuda.stream(stream):
                x = torch.empty(a.batch, a.dim, device=dev)
                y = torch.empty(a.batch, 1, device=dev)
            with weft.use(stream, writes=[x, y]):
                x.normal_(generator=gen)
                torch.matmul(x, w_true, out=y)
        else:
            with torch.cuda.stream(stream):
                x = torch.randn(a.batch, a.dim, device=dev, generator=gen)
                y = x @ w_true
        return x, y

    def step(x, y):
        opt.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    # ---- eager: the side stream prefetches batch k+1 while the main stream trains on batch k ----
    losses_eager = []
    nxt = make_batch(side)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for k in range(a.steps):
        x, y = nxt
        if use_weft:
            with weft.use(main_stream, reads=[x, y]):  # waits for the prefetch, recorded as read here
                loss = step(x, y)
        else:
            main_stream.wait_stream(side)
            x.record_stream(main_stream)
            y.record_stream(main_stream)
            loss = step(x, y)
        nxt = make_batch(side)  # overlaps with the step
        del x, y  # freed on the side stream (weft: after the main stream's declared read)
        losses_eager.append(loss.detach())
    torch.cuda.synchronize()
    eager_ms = (time.perf_counter() - t0) * 1e3 / max(a.steps, 1)
    losses_eager = [float(v) for v in losses_eager]
    # The last step's loss keeps its autograd graph, and with it the parameters' AccumulateGrad
    # nodes made on the main (legacy) stream, alive: captured, backward would run them there and
    # make the legacy stream depend on the capturing stream (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
    # PyTorch's "AccumulateGrad node's stream does not match" warning). Whatever the allocator.
    del loss

    # ---- capture one step (warm-up on a side stream first, as PyTorch's recipe says) ----
    static_x = torch.empty(a.batch, a.dim, device=dev)
    static_y = torch.empty(a.batch, 1, device=dev)
    x, y = nxt
    torch.cuda.synchronize()
    static_x.copy_(x)
    static_y.copy_(y)
    torch.cuda.synchronize()
    warm = torch.cuda.Stream(dev)
    warm.wait_stream(main_stream)
    with torch.cuda.stream(warm):
        for _ in range(3):
            step(static_x, static_y)
    main_stream.wait_stream(warm)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_loss = step(static_x, static_y)
    torch.cuda.synchronize()

    def reserved():
        if use_weft:
            s = weft.stats()
            return s.get("reserved_bytes", 0) + s.get("graph_pool_reserved", 0)
        return torch.cuda.memory_reserved(dev)

    losses_replay = []
    batches = [make_batch(main_stream) for _ in range(4)]
    torch.cuda.synchronize()
    reserved_after_first = None
    t0 = time.perf_counter()
    timed_from = a.checked
    for r in range(a.replays):
        bx, by = batches[r % len(batches)]
        static_x.copy_(bx)
        static_y.copy_(by)
        g.replay()
        if r < a.checked:
            losses_replay.append(float(static_loss))  # synchronises
        if r == 0:
            torch.cuda.synchronize()
            reserved_after_first = reserved()
        if r + 1 == timed_from:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
    torch.cuda.synchronize()
    replay_ms = (time.perf_counter() - t0) * 1e3 / max(a.replays - timed_from, 1)
    reserved_end = reserved()
    free1, _ = torch.cuda.mem_get_info(dev)

    out = {
        "allocator": a.allocator,
        "card": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "steps": a.steps,
        "replays": a.replays,
        "eager_step_ms": eager_ms,
        "replay_step_ms": replay_ms,
        "losses_eager": losses_eager,
        "losses_replay": losses_replay,
        "reserved_after_first_replay": reserved_after_first,
        "reserved_end": reserved_end,
        "peak_reserved": (weft.stats().get("reserved_peak", 0) + weft.stats().get("graph_pool_reserved", 0))
        if use_weft
        else torch.cuda.max_memory_reserved(dev),
        "device_memory_held": free0 - free1,
    }
    if use_weft:
        out["weft"] = weft.stats()
    print(
        "%s on %s (torch %s): eager %.3f ms/step, replayed %.3f ms/step; loss %.6g -> %.6g (eager), %.6g -> %.6g "
        "(replayed); peak reserved %.1f MiB; reserved after the first replay %.1f MiB, after %d replays %.1f MiB; "
        "device memory held %.1f MiB"
        % (
            a.allocator,
            out["card"],
            out["torch"],
            eager_ms,
            replay_ms,
            losses_eager[0] if losses_eager else float("nan"),
            losses_eager[-1] if losses_eager else float("nan"),
            losses_replay[0] if losses_replay else float("nan"),
            losses_replay[-1] if losses_replay else float("nan"),
            out["peak_reserved"] / 2**20,
            (reserved_after_first or 0) / 2**20,
            a.replays,
            reserved_end / 2**20,
            out["device_memory_held"] / 2**20,
        )
    )
    if use_weft:
        print("weft:", json.dumps(out["weft"]))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
