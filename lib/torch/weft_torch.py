"""weft from PyTorch: install weft as PyTorch's CUDA allocator, read its counters, and declare
what work on PyTorch streams reads and writes so that weft orders streams for you.

    import weft_torch as weft
    weft.install()                      # before PyTorch allocates any CUDA memory
    ...
    with weft.use(side, writes=[x]):    # work enqueued on `side` inside the block
        x.copy_(batch, non_blocking=True)
    with weft.use(main, reads=[x]):     # main waits for side's write: no wait_stream
        y = model(x)
    del x                               # freed on its stream after main's read: no record_stream
    print(weft.stats())

The library is libweft_torch.so (//lib/torch:libweft_torch.so): found from the `path` argument,
$WEFT_TORCH_LIB, or next to this file. Loading it needs no environment variable.
"""
import contextlib
import ctypes
import json
import os

_lib = None
record_stream_hooked = False  # install() set PyTorch's record_stream hook (weft_torch_record_stream)
empty_cache_hooked = False  # install() set PyTorch's reset hook (torch.cuda.empty_cache: weft_torch_empty_cache)
graph_pools_hooked = False  # install() set PyTorch's graph-pool hooks (begin/end allocate to pool, release pool)


def library_path(path=None):
    """The path of libweft_torch.so that install() and the other calls use."""
    if path:
        return path
    if os.environ.get("WEFT_TORCH_LIB"):
        return os.environ["WEFT_TORCH_LIB"]
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libweft_torch.so")


def _load(path=None):
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(library_path(path))
        u64p = ctypes.POINTER(ctypes.c_uint64)
        for name in ("weft_torch_use_begin", "weft_torch_use_end"):
            f = getattr(lib, name)
            f.argtypes = [ctypes.c_int, ctypes.c_void_p, u64p, ctypes.c_size_t, u64p, ctypes.c_size_t]
            f.restype = ctypes.c_int
        lib.weft_torch_stats.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
        lib.weft_torch_stats.restype = ctypes.c_int
        lib.weft_torch_release_graph_pools.argtypes = [ctypes.c_int]
        lib.weft_torch_release_graph_pools.restype = ctypes.c_int
        lib.weft_torch_last_error.restype = ctypes.c_char_p
        lib.weft_torch_version.restype = ctypes.c_uint
        _lib = lib
    return _lib


def _hook(alloc, path, setter_name, fn_name):
    """Sets one of the allocator's hooks to a function of the library; whether it could."""
    setter = getattr(alloc.allocator(), setter_name, None)
    fn = getattr(_load(path), fn_name, None)
    if setter is None or fn is None:
        return False
    setter(ctypes.cast(fn, ctypes.c_void_p).value)
    return True


def install(path=None):
    """Makes weft PyTorch's CUDA allocator (torch.cuda.memory.CUDAPluggableAllocator). Call it
    before PyTorch allocates CUDA memory: PyTorch refuses to switch allocators afterwards."""
    import torch

    p = library_path(path)
    alloc = torch.cuda.memory.CUDAPluggableAllocator(p, "weft_torch_alloc", "weft_torch_free")
    # Where PyTorch lets Python set them: tensor.record_stream(s) (ProcessGroupNCCL makes it for
    # every collective's tensors: the free then waits for the recorded streams' work), and
    # torch.cuda.empty_cache() (weft gives back what it holds beyond live tensors).
    global record_stream_hooked, empty_cache_hooked, graph_pools_hooked
    record_stream_hooked = _hook(alloc, p, "set_record_stream_fn", "weft_torch_record_stream")
    empty_cache_hooked = _hook(alloc, p, "set_reset_fn", "weft_torch_empty_cache")
    # torch.cuda.graph's pools: captures into one PyTorch pool share a graph pool, given back when
    # PyTorch releases it (the graphs deleted) and no tensor from it is live. All three or none
    # (a begin never released would keep its pool for good).
    pool_hooks = (("set_begin_allocate_to_pool", "weft_torch_begin_allocate_to_pool"),
                  ("set_end_allocate_to_pool_fn", "weft_torch_end_allocate_to_pool"),
                  ("set_release_pool", "weft_torch_release_pool"))
    if all(getattr(alloc.allocator(), setter, None) is not None for setter, _ in pool_hooks):
        graph_pools_hooked = all([_hook(alloc, p, setter, fn) for setter, fn in pool_hooks])
    torch.cuda.memory.change_current_allocator(alloc)
    _load(p)  # the same library (dlopen gives PyTorch's handle back): the same state
    return p


def version():
    v = _load().weft_torch_version()
    return "%d.%d.%d" % (v >> 16, (v >> 8) & 0xFF, v & 0xFF)


def stats(device=None):
    """weft's counters and memory for a device as a dict (see weft_torch.h): uses, waits_issued,
    waits_skipped, allocs, frees, live_bytes, reserved_bytes, reserved_peak, graph_pools,
    graph_pool_reserved, alloc_failures, free_failures, ... Empty before the first allocation."""
    dev = _device(device)
    buf = ctypes.create_string_buffer(4096)
    n = _load().weft_torch_stats(dev, buf, len(buf))
    return json.loads(buf.value.decode()) if n > 0 else {}


def release_graph_pools(device=None):
    """Frees the memory of captures that weft met with no PyTorch pool hooks (graph_pools_hooked
    False: an older PyTorch, or captures begun by other code) whose graphs are gone (call after
    deleting or resetting them). With the hooks PyTorch releases its pools itself. Returns how
    many graph pools were released."""
    return _load().weft_torch_release_graph_pools(_device(device))


def last_error():
    return _load().weft_torch_last_error().decode()


def _device(device):
    if device is None:
        import torch

        return torch.cuda.current_device()
    return int(device.index if hasattr(device, "index") and device.index is not None else device)


def _pointers(tensors):
    ptrs = [int(t.data_ptr()) for t in tensors if t is not None and t.numel() > 0]
    return (ctypes.c_uint64 * max(len(ptrs), 1))(*ptrs), len(ptrs)


@contextlib.contextmanager
def use(stream=None, reads=(), writes=()):
    """Work enqueued on `stream` (a torch.cuda.Stream; None: the current stream) inside the block
    reads `reads` and writes `writes` (tensors weft allocated). On entry weft makes the stream wait
    for what it needs from other streams' declared work and frees; on exit it records the work,
    so that later uses and frees elsewhere wait for it. Raises RuntimeError if weft refuses."""
    import torch

    s = stream if stream is not None else torch.cuda.current_stream()
    handle = ctypes.c_void_p(s.cuda_stream)
    dev = _device(s.device)
    r, nr = _pointers(reads)
    w, nw = _pointers(writes)
    lib = _load()
    if lib.weft_torch_use_begin(dev, handle, r, nr, w, nw) != 0:
        raise RuntimeError(last_error())
    try:
        with torch.cuda.stream(s):
            yield s
    finally:
        if lib.weft_torch_use_end(dev, handle, r, nr, w, nw) != 0:
            raise RuntimeError(last_error())
