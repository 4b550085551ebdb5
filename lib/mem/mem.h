/* lib/mem: memory resources and adaptors (README.md says what the layer owns and may call).
 *
 * Every call into a resource goes through weft__resource_allocate / weft__resource_deallocate
 * (resource.c): they keep the counts every resource reports, so a resource writes only what is
 * its own. Constructors take the tracker of the runtime they serve; the public weft_*_create
 * functions (lib/runtime) resolve a runtime handle and call them.
 *
 * Locks: every resource that needs one has one pthread mutex of rank 20 (streams/tracker.h lists
 * the ranks). A resource may call tracker functions (rank 30) while holding it, never the
 * reverse. A resource may also call its upstream while holding its own lock: stacks are acyclic
 * (an upstream never calls down), so nested resource locks are always taken top to bottom.
 */
#ifndef WEFT_MEM_MEM_H
#define WEFT_MEM_MEM_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "lib/core/debug.h"
#include "lib/core/driver.h"
#include "lib/core/error.h"
#include "lib/core/meta.h"
#include "streams/tracker.h"
#include "weft/weft.h"

/* The largest request any resource accepts: 2^48 bytes (256 TiB), far above any device and low
 * enough that adding alignment, canaries or chunk rounding can never overflow 64 bits. */
#define WEFT__MEM_MAX_BYTES (1ull << 48)

/* ---- dispatch (resource.c) ----------------------------------------------------------------- */

/** r->ops->allocate, counted. The caller has checked the arguments. */
weft_status_t weft__resource_allocate(weft_resource_t *r, size_t bytes, weft_stream_t *s, const char *tag,
                                      CUdeviceptr *out);
/** r->ops->deallocate, counted. The caller has checked the arguments. */
weft_status_t weft__resource_deallocate(weft_resource_t *r, CUdeviceptr p, size_t bytes, weft_stream_t *s,
                                        const char *tag);
/** Counts `bytes` as handed out by r without a call to its allocate (a graph launch allocates
 * its outputs itself), or as given back without a call to its deallocate (the memory left with
 * a graph). */
void weft__resource_adopt(weft_resource_t *r, uint64_t bytes);
void weft__resource_disown(weft_resource_t *r, uint64_t bytes);
/** r->ops->destroy (if any): the first failure, everything given back regardless. */
weft_status_t weft__resource_destroy(weft_resource_t *r);
/** The resource's trim, or its upstream's when it has none (OK at the bottom). */
weft_status_t weft__resource_trim(weft_resource_t *r, size_t keep);

/* ---- helpers shared by the resources (resource.c) -------------------------------------------- */

/** Fills a resource's base: its ops, its upstream (NULL at the bottom) and its runtime. */
static inline void weft__resource_init(weft_resource_t *r, const weft_resource_ops_t *ops, weft_resource_t *upstream,
                                       weft_runtime_t *rt) {
  r->ops = ops;
  r->upstream = upstream;
  r->rt = rt;
}

/** A resource that holds nothing of its own beyond its tracker (direct, graph memory nodes). */
typedef struct weft__plain_resource {
  weft_resource_t base; /* first */
  weft__tracker_t *tr;
} weft__plain_resource_t;
/** Makes a plain resource with `ops` (whose destroy is weft__plain_resource_destroy). */
weft_status_t weft__plain_resource_create(weft__tracker_t *tr, weft_runtime_t *rt, const weft_resource_ops_t *ops,
                                          weft_resource_t **out);
weft_status_t weft__plain_resource_destroy(weft_resource_t *r);

/** Checks a request size: INVALID_ARGUMENT naming `who` for 0 and for more than
 * WEFT__MEM_MAX_BYTES. */
weft_status_t weft__mem_check_bytes(const char *who, size_t bytes);
/** Checks an adaptor's upstream: not NULL, has allocate and deallocate, and serves `rt`. */
weft_status_t weft__mem_check_upstream(const char *who, weft_runtime_t *rt, const weft_resource_t *up);
/** Initialises a resource mutex (rank 20). */
weft_status_t weft__mem_lock_init(pthread_mutex_t *m, const char *who);
/** Adds `bytes` to a reserved counter and raises its peak (the caller holds its lock). */
static inline void weft__mem_reserve(uint64_t *reserved, uint64_t *peak, uint64_t bytes) {
  *reserved += bytes;
  if (*reserved > *peak) *peak = *reserved;
}

/* ---- the built-in resources, one file each ------------------------------------------------------ */

/* weft_resource_t.ops of each, also used to recognise them. */
extern const weft_resource_ops_t weft__direct_ops, weft__async_ops, weft__pool_ops, weft__budget_ops,
    weft__logging_ops, weft__stats_ops, weft__guard_ops, weft__graph_nodes_ops;

/* ---- counts kept under a resource's own lock (resource.c) ----------------------------------------
 * The pool takes its lock on every call anyway, so it keeps live bytes, peak, allocs and frees
 * there, with relaxed loads and stores, instead of the dispatch's four atomic read-modify-writes
 * a pair (a third of its pair on the GPU hosts: bench/data/h100x2-4886999/pool_bound.txt). The
 * dispatch then counts only failures (atomically, as ever); readers load each count as before. */

/** Whether r keeps its own counts (weft__counts_out / weft__counts_back under its lock). */
static inline bool weft__resource_counts_itself(const weft_resource_t *r) { return r->ops == &weft__pool_ops; }
/** `bytes` handed out (an allocation, or adopted) / given back (a free, or disowned); only under
 * the lock of the resource that keeps c. */
static inline void weft__counts_out(weft_resource_counts_t *c, uint64_t bytes) {
  uint64_t live = __atomic_load_n(&c->live_bytes, __ATOMIC_RELAXED) + bytes;
  __atomic_store_n(&c->live_bytes, live, __ATOMIC_RELAXED);
  if (live > __atomic_load_n(&c->live_peak, __ATOMIC_RELAXED)) __atomic_store_n(&c->live_peak, live, __ATOMIC_RELAXED);
  __atomic_store_n(&c->allocs, __atomic_load_n(&c->allocs, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
}
static inline void weft__counts_back(weft_resource_counts_t *c, uint64_t bytes) {
  uint64_t live = __atomic_load_n(&c->live_bytes, __ATOMIC_RELAXED);
  WEFT_ASSERT_INTERNAL(live >= bytes);
  __atomic_store_n(&c->live_bytes, live - bytes, __ATOMIC_RELAXED);
  __atomic_store_n(&c->frees, __atomic_load_n(&c->frees, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
}

/** weft__resource_adopt / disown of a pool: its counts, under its lock (pool.c). */
void weft__pool_recount(weft_resource_t *r, uint64_t bytes, bool out);

/* Constructors behind the public weft_*_create (same arguments and errors, the runtime resolved to
 * its tracker `tr`; `rt` is kept as the resource's runtime). */
weft_status_t weft__direct_create(weft__tracker_t *tr, weft_runtime_t *rt, weft_resource_t **out);
weft_status_t weft__async_create(weft__tracker_t *tr, weft_runtime_t *rt, const weft_async_options_t *opts,
                                 weft_resource_t **out);
weft_status_t weft__pool_create(weft__tracker_t *tr, weft_runtime_t *rt, weft_resource_t *upstream,
                                const weft_pool_options_t *opts, weft_resource_t **out);
weft_status_t weft__budget_create(weft__tracker_t *tr, weft_runtime_t *rt, weft_resource_t *upstream, uint64_t limit,
                                  const char *shared_key, weft_resource_t **out);
/* `rmm`: RMM's columns (logging.c). */
weft_status_t weft__logging_create(weft__tracker_t *tr, weft_runtime_t *rt, weft_resource_t *upstream, const char *path,
                                   weft_log_sink_fn sink, void *user, bool rmm, weft_resource_t **out);
weft_status_t weft__stats_create(weft__tracker_t *tr, weft_runtime_t *rt, weft_resource_t *upstream,
                                 weft_resource_t **out);
weft_status_t weft__guard_create(weft__tracker_t *tr, weft_runtime_t *rt, weft_resource_t *upstream,
                                 const weft_guard_options_t *opts, weft_resource_t **out);
/** Graph memory nodes (graphmem.c): on a capturing stream an allocation becomes a memory
 * allocation node of the graph (cuMemAllocAsync) and a free a free node (cuMemFreeAsync); on a
 * live stream a free gives a graph's output back (the next launch reuses its address). What a
 * capture hands weft_alloc unless it draws from a graph pool. */
weft_status_t weft__graph_nodes_create(weft__tracker_t *tr, weft_runtime_t *rt, weft_resource_t **out);

/** cuDeviceGraphMemTrim of the tracker's device (under the graph-memory lock). */
weft_status_t weft__graph_memory_trim(weft__tracker_t *tr);

#endif /* WEFT_MEM_MEM_H */
