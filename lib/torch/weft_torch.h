/* weft as PyTorch's CUDA allocator: the CUDAPluggableAllocator C ABI, and a few calls for the
 * Python helper (weft_torch.py). Built as libweft_torch.so (//lib/torch:libweft_torch.so), which
 * loads with plain dlopen, needs no libstdc++ and no environment variable.
 *
 * What PyTorch asks of an allocator, and what weft does:
 *   - alloc(size, device, stream): memory usable on `stream` at once (stream order), from the
 *     runtime of `device` (weft_runtime_get with options from the environment). `stream` is
 *     adopted (weft_stream_adopt): PyTorch's default stream is the legacy NULL stream. 0 bytes
 *     give NULL, as PyTorch's own allocator does. On failure, inside PyTorch, a C++
 *     std::runtime_error with weft's message (Python: RuntimeError): PyTorch does not check what
 *     a pluggable allocator returns, and a NULL tensor's first kernel would fault the context.
 *     Elsewhere (a C program) NULL; weft_torch_last_error() says why.
 *   - free(ptr, size, device, stream): weft_free_ptr on the stream the block was allocated on
 *     (PyTorch passes it): the memory is reused at once on that stream and, on any other stream,
 *     only after that stream is ordered after the free. Work declared with weft_torch_use_* on
 *     other streams is waited for first, and so is the work of streams recorded with
 *     tensor.record_stream (weft_torch_record_stream).
 *   - allocations on a stream that PyTorch is capturing (torch.cuda.graph) come from a graph pool
 *     (weft_capture_allocate_to), PyTorch's private-pool semantics: fixed addresses, a range freed
 *     inside the capture is reused later in it, what is live at the end belongs to the graph.
 *     With CUDAPluggableAllocator's pool hooks (weft_torch.py sets them where PyTorch lets Python:
 *     weft_torch_begin_allocate_to_pool, _end_allocate_to_pool, _release_pool) the graph pool is
 *     PyTorch's pool id's: captures into one PyTorch pool (pool=g.pool(), graph_pool_handle())
 *     share it, and it is destroyed once PyTorch released it (the graphs deleted or reset) and no
 *     tensor from it is live. Without them, each capture has a pool of its own, kept until
 *     weft_torch_release_graph_pools(). The capture itself is seen through the stream
 *     (cuStreamGetCaptureInfo), so a capture begun by other code is served as well.
 * Thread-safe: PyTorch allocates and frees from any thread. */
#ifndef WEFT_TORCH_H
#define WEFT_TORCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <cuda.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WEFT_TORCH_API __attribute__((visibility("default")))

/** CUDAPluggableAllocator's alloc: `stream` is a cudaStream_t (the same handle as a CUstream). */
WEFT_TORCH_API void *weft_torch_alloc(ssize_t size, int device, CUstream stream);
/** CUDAPluggableAllocator's free. Frees of memory a captured graph kept are ignored (the graph
 * owns it). A free that fails is kept and made again, on the same stream, by the device's next
 * adapter call (alloc, free, use, release_graph_pools) until it succeeds: a tensor made before a
 * capture and freed inside it (weft refuses to free inside: the free would run at every replay)
 * is freed once the capture has ended, as PyTorch's own allocator does; a transient failure is
 * made good. Failures other than a capture's refusal are counted (free_failures) and the first
 * ones printed (PyTorch cannot be told); stats give frees_kept and frees_pending. */
WEFT_TORCH_API void weft_torch_free(void *ptr, ssize_t size, int device, CUstream stream);

/** CUDAPluggableAllocator's record_stream (tensor.record_stream(stream); weft_torch.py sets it
 * where PyTorch lets Python set it): work on `stream` that weft does not see uses the memory at
 * ptr, enqueued before or after this call, until the free. At the free, the free's stream first
 * waits for all work enqueued so far on each such stream (weft_stream_import_stream), so the
 * memory is reused only after that work, as with PyTorch's allocator; while either stream
 * captures, the free is kept until the capture has ended. At most 8 streams per tensor. */
WEFT_TORCH_API void weft_torch_record_stream(void *ptr, CUstream stream);

/** Declares a piece of work on `stream` that reads `reads` and writes `writes` (device pointers,
 * the start of or inside memory from weft_torch_alloc): begin issues the waits it needs against
 * other streams' declared work (and frees), end records it. Between the two the caller enqueues
 * the work (PyTorch kernels). Pointers weft does not know are skipped; at most 256 in all; the
 * same lists must be given to end. Returns 0 or a
 * weft_status_t (weft_torch_last_error() says why). */
WEFT_TORCH_API int weft_torch_use_begin(int device, CUstream stream, const uint64_t *reads, size_t n_reads,
                                        const uint64_t *writes, size_t n_writes);
WEFT_TORCH_API int weft_torch_use_end(int device, CUstream stream, const uint64_t *reads, size_t n_reads,
                                      const uint64_t *writes, size_t n_writes);

/** A JSON object of the device's counters: weft's (weft_counters_t), the runtime resource's
 * (weft_resource_stats_t: live and reserved bytes with peaks; live_bytes leaves out the blocks the
 * streams cached, cached_bytes, as PyTorch's "allocated" leaves out its cache; live_peak counts
 * them), graph pools of captures and the adapter's own (allocs, frees, zero-byte requests,
 * failures). Returns the bytes written (without
 * the NUL; truncated to len - 1), or -1 when the device has no runtime yet. */
WEFT_TORCH_API int weft_torch_stats(int device, char *buf, size_t len);
/** torch.cuda.empty_cache() (PyTorch's reset hook; weft_torch.py sets it where Python can): every
 * device's runtime gives back what it holds beyond live tensors (weft_runtime_trim: the streams'
 * caches, then the pool's idle chunks; the kept frees are made first). Live tensors and graph
 * pools keep their memory; a stream taking part in a capture keeps its cache. */
WEFT_TORCH_API void weft_torch_empty_cache(void);
/** PyTorch's pool id (c10::cuda::MempoolId_t, a pair of unsigned long long passed by value). */
typedef struct weft_torch_mempool_id {
  unsigned long long first, second;
} weft_torch_mempool_id_t;
/** CUDAPluggableAllocator's begin_allocate_to_pool (CUDAGraph::capture_begin calls it before
 * cuStreamBeginCapture, on the capturing thread): the capture weft meets next on this thread (else
 * the only one waiting on the device) draws from the graph pool of `id`, made at that moment, or
 * the one earlier captures into `id` drew from. `filter` (PyTorch's std::function, passed by
 * reference under the C++ ABI) is not called. */
WEFT_TORCH_API void weft_torch_begin_allocate_to_pool(int device, weft_torch_mempool_id_t id, const void *filter);
/** CUDAPluggableAllocator's end_allocate_to_pool (after the capture ended): pool `id` serves no
 * capture now; a later begin with `id` draws from it again. */
WEFT_TORCH_API void weft_torch_end_allocate_to_pool(int device, weft_torch_mempool_id_t id);
/** CUDAPluggableAllocator's release_pool (CUDAGraph::reset: the graph deleted or reset): one use
 * of `id` less (each begin made one). With none left, the graph pool is destroyed as soon as no
 * tensor allocated from it is live (now, or at the last one's free): weft waits for the device's
 * work on it first. */
WEFT_TORCH_API void weft_torch_release_pool(int device, weft_torch_mempool_id_t id);
/** Destroys the graph pools of captures weft met with no begin_allocate_to_pool (the hooks not
 * set, or captures begun by other code) that have ended: call once their graphs are gone
 * (torch.cuda.CUDAGraph.reset() or deleted). PyTorch's own pools are left to release_pool.
 * Returns how many were destroyed. */
WEFT_TORCH_API int weft_torch_release_graph_pools(int device);
/** The last failure's message on this thread ("" if none). */
WEFT_TORCH_API const char *weft_torch_last_error(void);
/** weft_version(): for loaders that check the library. */
WEFT_TORCH_API unsigned weft_torch_version(void);

#ifdef __cplusplus
}
#endif

#endif /* WEFT_TORCH_H */
