/* lib/: the runtime object per device and the block records (internal header of the top layer).
 *
 * Runtimes live in a static table indexed by device ordinal, so a handle is never dangling: a
 * released runtime is a slot marked dead, and calls on it return STALE_HANDLE. Block records are
 * recycled (FIFO) within their runtime's slot and never returned to the host heap while the
 * process runs, so a stale weft_block_t can always be checked by its generation.
 *
 * Locks (ranks, see streams/tracker.h): registry 10 < a runtime's block table 15 < resources 20
 * < tracker 30.
 */
#ifndef WEFT_LIB_RUNTIME_H
#define WEFT_LIB_RUNTIME_H

#include <stdatomic.h>

#include "lib/core/driver.h"
#include "streams/tracker.h"

#define WEFT__MAX_DEVICES 64
/* Freed records kept back from reuse, so that double frees are told from stale handles. */
#define WEFT__FREED_KEPT 256

typedef enum weft__block_state {
  WEFT__BLOCK_UNUSED = 0, /* record on the free list */
  WEFT__BLOCK_LIVE = 1,
  WEFT__BLOCK_FREEING = 2, /* weft_free in progress (guards against a concurrent double free) */
  WEFT__BLOCK_FREED = 3,   /* freed; the record waits on the free list for reuse */
} weft__block_state_t;

typedef enum weft__block_kind {
  WEFT__BLOCK_OWNED = 0,   /* from the runtime's resource */
  WEFT__BLOCK_WRAPPED = 1, /* weft_block_wrap: not ours to free */
  WEFT__BLOCK_GRAPH = 2,   /* a graph memory node's allocation (graph/) */
} weft__block_kind_t;

/** One allocation's record. */
struct weft__block {
  weft_runtime_t *rt;
  _Atomic uint64_t gen;    /* bumped when the record is handed out for a new block */
  _Atomic int state;       /* weft__block_state_t */
  unsigned kind;           /* weft__block_kind_t */
  CUdeviceptr ptr;
  size_t bytes;
  const char *tag;         /* interned */
  weft_resource_t *resource; /* what allocated it (OWNED) */
  void *owner;             /* graph/: the graph or exec owning a GRAPH block */
  weft__access_state_t acc; /* guarded by the tracker lock */
  struct weft__block *next; /* free list (FIFO) or live list link */
  struct weft__block *prev; /* live list */
  unsigned reads_cap;      /* capacity of acc.reads */
};

struct weft_runtime {
  int ordinal;
  _Atomic int alive;        /* 1 between creation and the last release */
  int refs;                 /* guarded by the registry lock */
  weft_options_t opts;
  char log_path[512];       /* backing store of opts.log_path */
  char shared_key[256];     /* backing store of opts.budget_shared_key */
  const weft__driver_t *drv;
  weft__tracker_t tracker;
  weft_resource_t *top;      /* what weft_alloc uses */
  weft_resource_t *stack[6]; /* resources the runtime built from its options, bottom first */
  unsigned stack_n;
  _Atomic uint64_t allocs, frees;
  pthread_mutex_t blocks_lock; /* rank 15: the lists below */
  struct weft__block *free_head, *free_tail; /* FIFO of reusable records */
  struct weft__block *live;    /* every LIVE or FREEING block */
  size_t live_count;
  size_t free_count;           /* records on the FIFO */
  void *graph_state;           /* graph/'s per-runtime state (capture registry) */
};

/** The runtime of a live handle, or NULL after recording STALE_HANDLE / INVALID_ARGUMENT. */
weft_runtime_t *weft__runtime_check(weft_runtime_t *rt, const char *fn);
/** Checks a stream handle: a pool stream of a live runtime. */
weft_status_t weft__stream_check(const weft_stream_t *s, const char *fn);
/** Resolves a live block handle to its record. `fn` names the caller for messages.
 * Errors: INVALID_ARGUMENT (null handle), STALE_HANDLE (freed or reused, runtime released). */
weft_status_t weft__block_check(weft_block_t b, const char *fn, struct weft__block **out);
/** Resolves accesses to tracker uses; checks every block belongs to s's runtime.
 * `uses` has room for n. */
weft_status_t weft__uses_from_accesses(weft_stream_t *s, const weft_access_t *acc, size_t n, weft__use_t *uses,
                                       const char *fn);
/** Takes a record for a new block (gen bumped, state still UNUSED) or NULL. */
struct weft__block *weft__block_take(weft_runtime_t *rt);
/** Publishes a taken record as LIVE; returns its handle. */
weft_block_t weft__block_publish(weft_runtime_t *rt, struct weft__block *rec);
/** Returns a record (taken but never published, or freed) to the FIFO. */
void weft__block_retire(weft_runtime_t *rt, struct weft__block *rec);

/** Drops a GRAPH block's record without calling a resource (graph/ frees its memory). */
void weft__block_forget(struct weft__block *rec);

/* Hooks filled by graph/ when it is linked in (weft_alloc / weft_free / release consult them):
 * inside a capture on s, allocations and frees become memory nodes (handled = true). */
typedef weft_status_t (*weft__graph_alloc_hook_fn)(weft_stream_t *s, size_t bytes, const char *tag, weft_block_t *out,
                                                   bool *handled);
typedef weft_status_t (*weft__graph_free_hook_fn)(struct weft__block *rec, weft_stream_t *s, bool *handled);
extern weft__graph_alloc_hook_fn weft__graph_alloc_hook;
extern weft__graph_free_hook_fn weft__graph_free_hook;
extern weft_status_t (*weft__graph_release_hook)(weft_runtime_t *rt);

#endif /* WEFT_LIB_RUNTIME_H */
