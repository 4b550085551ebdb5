/* lib/runtime: the runtime object per device, block records, uses (internal header; layer 4).
 *
 * Runtimes live in a static table indexed by device ordinal, so a handle is never dangling: a
 * released runtime is a slot marked dead, and calls on it return STALE_HANDLE. Block records are
 * recycled (FIFO) within their runtime's slot and never returned to the host heap while the
 * process runs, so a stale weft_block_t can always be checked by its generation.
 *
 * A block belongs to the resource that allocated it (NULL: wrapped memory weft does not own):
 * weft_free gives it back there, whether that is the runtime's stack, a capture's graph memory
 * or a graph's outputs. The runtime never calls graph/: a capture hands weft_alloc the resource
 * to allocate from (weft__capture_t.alloc_to).
 *
 * Locks (ranks, see streams/tracker.h): a slot's life lock 5 < a runtime's block table 15 <
 * resources 20 < tracker 30. No lock is held across a host synchronisation.
 */
#ifndef WEFT_LIB_RUNTIME_H
#define WEFT_LIB_RUNTIME_H

#include <stdatomic.h>

#include "lib/core/driver.h"
#include "lib/core/lock.h"
#include "lib/mem/mem.h"
#include "streams/tracker.h"

#define WEFT__MAX_DEVICES 64
/* Freed records kept back from reuse, so that double frees are told from stale handles. */
#define WEFT__FREED_KEPT 256

typedef enum weft__block_state {
  WEFT__BLOCK_UNUSED = 0,  /* record on the free list, never handed out or retired unpublished */
  WEFT__BLOCK_LIVE = 1,
  WEFT__BLOCK_FREEING = 2, /* weft_free in progress (guards against a concurrent double free) */
  WEFT__BLOCK_FREED = 3,   /* freed; the record waits on the free list for reuse */
  WEFT__BLOCK_CACHED = 4,  /* freed into its stream's cache (cache.c): memory still held from its
                              resource, record still in the live list and the address map */
} weft__block_state_t;

/* Blocks one stream's cache holds at most (whatever their bytes). */
#define WEFT__CACHE_SLOTS 16

/** Blocks freed on one stream, kept for that stream's next weft_alloc of the same size (cache.c).
 * Slots are oldest first. */
typedef struct weft__stream_cache {
  weft__lock_t lock; /* a leaf: nothing else is locked while it is held */
  struct weft__block *slot[WEFT__CACHE_SLOTS];
  unsigned n;
  /* The bytes of the slots' blocks, and the lane's share of the bound (its room:
   * weft_runtime_t.cache_room counts every lane's); bytes <= room. A take keeps its room, so
   * that the lane's next put of as many bytes needs no word every thread shares (cache.c). */
  uint64_t bytes, room;
  /* Blocks handed out again and frees kept, counted under the lock: weft_runtime_counters adds
   * them to allocs and frees, so the common pair makes no add to a counter every thread shares. */
  uint64_t takes, puts;
  uint64_t fast_takes; /* of takes, the allocation fast path's (block.c; tests check it ran) */
} weft__stream_cache_t;

/** One allocation's record. */
struct weft__block {
  weft_runtime_t *rt;
  _Atomic uint64_t life;      /* WEFT__LIFE(generation, weft__block_state_t): one word, so that a
                                 claim checks the generation and LIVE in one compare-and-swap */
  CUdeviceptr ptr;
  size_t bytes;
  const char *tag;            /* interned */
  weft_resource_t *resource;  /* what allocated it and takes it back; NULL: wrapped, not ours */
  weft__access_state_t acc;   /* guarded by the tracker lock */
  struct weft__block *next;   /* free list (FIFO) or live list link; blocks_lock */
  struct weft__block *prev;   /* live list; blocks_lock */
  bool room;                  /* holds a by_ptr slot reserved by weft__block_make; blocks_lock */
  unsigned alloc_stream;      /* weft_alloc: the allocating stream's index (snapshots) */
  uint64_t alloc_ns;          /* weft_alloc: CLOCK_MONOTONIC_COARSE at allocation (snapshots) */
};

/** A record's life word: its generation (bumped each time the record is published for a new
 * block) and its state, so that no handle of an earlier life can claim a later one. */
#define WEFT__LIFE(gen, state) ((uint64_t)(gen) << 3 | (uint64_t)(state))
static inline uint64_t weft__life_gen(uint64_t life) { return life >> 3; }
static inline int weft__life_state(uint64_t life) { return (int)(life & 7); }
/** The record's life word (acquire: a LIVE read sees everything its publisher wrote before). */
static inline uint64_t weft__block_life(const struct weft__block *rec) {
  return atomic_load_explicit(&((struct weft__block *)rec)->life, memory_order_acquire);
}
static inline uint64_t weft__block_gen(const struct weft__block *rec) { return weft__life_gen(weft__block_life(rec)); }
static inline int weft__block_state(const struct weft__block *rec) { return weft__life_state(weft__block_life(rec)); }
/** Sets a record's state, keeping its generation. Only for whoever holds the record out of LIVE:
 * its claim (FREEING), the cache lock (CACHED), or a record no handle can claim any more. */
static inline void weft__block_set_state(struct weft__block *rec, int state) {
  uint64_t life = atomic_load_explicit(&rec->life, memory_order_relaxed);
  atomic_store_explicit(&rec->life, WEFT__LIFE(weft__life_gen(life), state), memory_order_release);
}
/** Starts a record's next life, LIVE under a new generation (release: after everything the caller
 * wrote to the record); returns that generation. The caller holds the record out of LIVE. */
static inline uint64_t weft__block_next_life(struct weft__block *rec) {
  uint64_t gen = weft__life_gen(atomic_load_explicit(&rec->life, memory_order_relaxed)) + 1;
  atomic_store_explicit(&rec->life, WEFT__LIFE(gen, WEFT__BLOCK_LIVE), memory_order_release);
  return gen;
}

/** A record's tag, read atomically: a cached block handed out again (block.c, reuse_cached)
 * stores its new tag without blocks_lock. */
static inline const char *weft__block_tag(const struct weft__block *rec) {
  const char *t = __atomic_load_n(&rec->tag, __ATOMIC_RELAXED);
  return t != NULL ? t : "";
}

/** The record a block's access history is embedded in. */
#define WEFT__BLOCK_OF(state) ((struct weft__block *)((char *)(state) - offsetof(struct weft__block, acc)))

/** A free on the legacy stream waiting for a blocking stream's capture to end: its block is
 * claimed (block.c, weft__runtime_flush_deferred). */
typedef struct weft__deferred {
  weft_block_t b;
  weft_stream_t *s;
} weft__deferred_t;

struct weft_runtime {
  int ordinal;
  _Atomic int alive;          /* 1 between creation and the start of the last release */
  int refs;                   /* guarded by the slot's life lock */
  weft_options_t opts;
  char log_path[WEFT_LOG_PATH_MAX + 1];   /* backing store of opts.log_path (validated to fit) */
  char shared_key[WEFT_BUDGET_KEY_MAX + 1]; /* backing store of opts.budget_shared_key (same) */
  const weft__driver_t *drv;
  weft__tracker_t tracker;
  weft_resource_t *top;       /* what weft_alloc uses outside captures */
  weft_resource_t *stack[6];  /* resources the runtime built from its options, bottom first */
  unsigned stack_n;
  weft_resource_t *graph_nodes; /* graph memory nodes: what a capture allocates from by default */
  _Atomic uint64_t allocs, frees;
  /* Objects made for this runtime that live on their own (graphs, graph pools, builders, the
   * resources weft_*_create makes): the last release waits for none of them, it refuses (BUSY). */
  _Atomic unsigned dependents;
  pthread_mutex_t blocks_lock; /* rank 15: the lists below */
  struct weft__block *free_head, *free_tail; /* FIFO of reusable records */
  struct weft__block *live;    /* every LIVE or FREEING block */
  size_t live_count;
  size_t free_count;           /* records on the FIFO */
  /* Live blocks by base address (weft_block_find, weft_free_ptr): ptr -> record. A record made
   * but not yet published holds a reserved slot (`room`, counted in by_ptr_room), so publishing
   * never allocates. */
  weft__map_t by_ptr;
  size_t by_ptr_room;
  /* Resources that own device memory outside the stack (graph pools): their segments appear in
   * weft_memory_snapshot. weft_resource_t *, blocks_lock. */
  weft__vec_t side;
  /* Frees on the legacy stream that had to wait for a blocking stream's capture to end
   * (weft__deferred_t), and how many (read without the lock). blocks_lock. */
  weft__vec_t deferred;
  _Atomic size_t n_deferred;
  weft_oom_handler_t oom_handler; /* blocks_lock */
  void *oom_user;
  weft_capture_handler_t capture_handler; /* blocks_lock */
  void *capture_user;
  /* The stream cache (cache.c): per lane; on when opts.stream_cache_bytes > 0 and the stack has
   * no guard or log (they must see every free). */
  weft__stream_cache_t cache[WEFT__MAX_STREAMS];
  bool cache_on;
  _Atomic uint64_t cache_room; /* the lanes' rooms (bytes), at most opts.stream_cache_bytes */
  _Atomic bool cache_spare;    /* some lane may have room its blocks do not fill (cache.c) */
  /* This life's number (process-wide, from 1), and for each device d the life of d's runtime
   * whose memory this runtime's device was given access to (weft_runtime_enable_peer_access;
   * 0: none). A peer's new life has new pools, so the access is granted again. */
  uint64_t life;
  _Atomic uint64_t peer_life[WEFT__MAX_DEVICES];
  /* Page-locked staging buffers for host copies of pageable memory (staging.c): newest first,
   * stage_lock (taken alone; driver calls inside it are event queries). Kept across the life. */
  pthread_mutex_t stage_lock;
  struct weft__stage *stages;
  _Atomic uint64_t staged_copies, stage_buffers; /* weft_counters_t's */
};

/* ---- staging.c: host copies of pageable memory ----------------------------------------------
 * Measured on 2 x H100 (driver 580.159.04; tests/conformance test_a_pageable_device_to_host_copy_
 * waits_for_its_stream): cuMemcpyDtoHAsync to pageable host memory returns only once the copy has
 * run, that is once its stream has reached it. weft enqueues inside the graph gate's shared side
 * (lib/core/gate.h) and inside a use whose lanes are busy (streams/tracker.c), so such a call
 * waited there for work that could need another thread first: a graph launch of that thread
 * needs the gate's exclusive side, and one rank's NCCL kernel waits for the other rank's, which
 * its thread had not launched yet (2 GPUs, a thread per rank: tests/comm/test_comm_long.c,
 * test_min_captured_sendrecv_thread_per_rank, hung). A pageable cuMemcpyHtoDAsync of 8 MiB
 * waited for its stream too (16 B did not: 2 x H200, conformance). So weft_copy_from_block and
 * weft_copy_to_block copy pageable memory through page-locked buffers of the runtime, a chunk of
 * WEFT__STAGE_BYTES at a time: the driver call is asynchronous, and the host waits for the
 * copy's event holding no lock and no gate. Page-locked user memory is copied directly. */
#define WEFT__STAGE_BYTES ((size_t)1 << 20)
/* Stages a runtime keeps (copies to the device in flight beyond that wait for the oldest). */
#define WEFT__STAGE_MAX 16u
typedef struct weft__stage weft__stage_t;
/** Whether the driver knows [p, p+n) as page-locked host memory (its first and last byte). */
bool weft__host_pinned(const weft__driver_t *d, const void *p, size_t n);
/** A stage of rt for one copy (binds rt's context to make one): a free one whose last copy is done, a new one,
 * or, with WEFT__STAGE_MAX in use, the oldest in flight once its copy is done (waited for holding
 * nothing). Errors: the driver's (cuMemHostAlloc), HOST_OUT_OF_MEMORY. */
weft_status_t weft__stage_take(weft_runtime_t *rt, weft__stage_t **out);
/** The stage's page-locked memory (WEFT__STAGE_BYTES) and its event. */
void *weft__stage_host(weft__stage_t *st);
CUevent weft__stage_event(weft__stage_t *st);
/** Gives a stage back; `in_flight`: a copy from it may still run (until its event). */
void weft__stage_give(weft_runtime_t *rt, weft__stage_t *st, bool in_flight);
/** Gives a stage back for good: a capture begun outside weft holds its copy. */
void weft__stage_lose(weft_runtime_t *rt, weft__stage_t *st);
/** Frees every stage (the runtime's last release, streams synchronised); the first failure. */
weft_status_t weft__stages_free(weft_runtime_t *rt);

/* ---- runtime.c ------------------------------------------------------------------------------ */

/** The process's runtimes, one slot per device (runtime.c's registry owns them). */
extern weft_runtime_t weft__runtimes[WEFT__MAX_DEVICES];
/** Whether rt is a runtime handle, live or released (one of the process's runtimes). */
static inline bool weft__runtime_is_handle(const weft_runtime_t *rt) {
  uintptr_t p = (uintptr_t)rt, lo = (uintptr_t)&weft__runtimes[0], hi = (uintptr_t)&weft__runtimes[WEFT__MAX_DEVICES];
  return p >= lo && p < hi && (p - lo) % sizeof(weft_runtime_t) == 0;
}
/** Whether rt is a live runtime handle (weft__runtime_check's test, recording nothing). */
static inline bool weft__runtime_live(const weft_runtime_t *rt) {
  return weft__runtime_is_handle(rt) && atomic_load_explicit(&rt->alive, memory_order_acquire);
}
/** The runtime of a live handle, or NULL after recording STALE_HANDLE / INVALID_ARGUMENT. The
 * check is inline; weft__runtime_refuse records why a handle fails it. */
weft_runtime_t *weft__runtime_refuse(weft_runtime_t *rt, const char *fn);
static inline weft_runtime_t *weft__runtime_check(weft_runtime_t *rt, const char *fn) {
  return __builtin_expect(weft__runtime_live(rt), 1) ? rt : weft__runtime_refuse(rt, fn);
}
/** The status weft__runtime_check() recorded for a handle it refused. */
weft_status_t weft__runtime_check_status(const weft_runtime_t *rt);
/** The tracker of a live runtime handle, or NULL with STALE_HANDLE / INVALID_ARGUMENT recorded
 * for `fn` (the status in *st). */
weft__tracker_t *weft__runtime_tracker(weft_runtime_t *rt, const char *fn, weft_status_t *st);
/** Makes sure rt's device may access the memory of `peer` (this life of it): enables it on first
 * need (weft_runtime_enable_peer_access); errors name `fn`. */
weft_status_t weft__runtime_peer_ready(weft_runtime_t *rt, weft_runtime_t *peer, const char *fn);
/** Counts an object that depends on rt into (+1) or out of (-1) rt->dependents. */
void weft__runtime_depend(weft_runtime_t *rt, int delta);
/** Lists a resource that owns device memory outside the runtime's stack (a graph pool), so that
 * weft_memory_snapshot shows its segments; false when the host is out of memory. Unlist it
 * before destroying it. */
bool weft__runtime_list_side(weft_runtime_t *rt, weft_resource_t *r);
void weft__runtime_unlist_side(weft_runtime_t *rt, weft_resource_t *r);

/** Totals of live blocks by a key (a tag pointer, or a stream index + 1): bytes and blocks, for the
 * OOM report (the top tags) and the memory snapshot (block.c). Beyond 256 distinct keys the rest
 * are not counted. Zero-initialise it. */
typedef struct weft__tally {
  const void *key[256];
  uint64_t bytes[256], count[256];
  size_t n;
} weft__tally_t;
void weft__tally_add(weft__tally_t *t, const void *key, uint64_t bytes);

/** The trace's slice of a use on s that started at t0 (weft__trace_now_us), named `name`, with its
 * accesses as arguments (use.c). Call only while weft__trace_on(). */
void weft__trace_use(weft_stream_t *s, const char *name, const weft_access_t *acc, size_t n, uint64_t t0);

/** Frees the blocks whose free on the legacy stream waited for a blocking capture (block.c), if
 * the legacy stream is usable again; one atomic load when there are none. */
void weft__runtime_flush_deferred(weft_runtime_t *rt);

/* ---- stream.c ----------------------------------------------------------------------------------- */

/** Whether s (not NULL) is a stream in use of a live runtime, whoever's thread it belongs to
 * (weft__stream_check and weft__stream_plain share it; it records nothing). */
static inline bool weft__stream_live(const weft_stream_t *s) {
  const weft_runtime_t *rt = s->runtime;
  return weft__runtime_live(rt) && s->tr == &rt->tracker && s->index < WEFT__MAX_STREAMS &&
         &rt->tracker.streams[s->index] == s && weft__tracker_lane_used(s->tr, s->index);
}
/** Whether s takes part in no capture weft knows of, nor drops one now (weft__stream_plain and
 * weft__stream_unseen share it; it records nothing). */
static inline bool weft__stream_uncaptured(const weft_stream_t *s) {
  return atomic_load_explicit(&s->capture, memory_order_acquire) == NULL &&
         atomic_load_explicit(&s->dropping, memory_order_acquire) == 0;
}
/** Checks a stream handle: a pool stream of a live runtime (a per-thread stream: of the calling
 * thread). The common case is inline; weft__stream_refuse looks closer and records why. */
weft_status_t weft__stream_refuse(const weft_stream_t *s, const char *fn);
static inline weft_status_t weft__stream_check(const weft_stream_t *s, const char *fn) {
  return __builtin_expect(s != NULL && !s->per_thread && weft__stream_live(s), 1) ? WEFT_OK
                                                                                   : weft__stream_refuse(s, fn);
}
/** Whether s (not NULL) passes weft__stream_check, is no per-thread stream and takes part in no
 * capture weft knows of (nor drops one now): a stream of a live runtime whose capture state only
 * code outside weft can have changed, and only if s is exposed (weft__stream_prepare asks the
 * driver then). Records no error; false says "look closer". Inline: every use's fast path asks. */
static inline bool weft__stream_plain(const weft_stream_t *s) {
  return weft__stream_live(s) && !s->per_thread && weft__stream_uncaptured(s);
}
/** The allocation fast path's weft__stream_prepare and weft__runtime_flush_deferred (block.c):
 * true where s (not NULL) is plain, the runtime has no deferred free to make, and s takes part in
 * no capture now, the driver asked where code outside weft may have begun one (an exposed
 * stream); *st is then WEFT_OK, or the failed answer's status, which weft__stream_prepare would
 * have returned (the caller returns it as the general path does). The context is bound only where
 * that question needs it (the legacy stream's handle names the current context's); a call that
 * makes a driver call of its own afterwards binds it first. False, nothing changed, where the
 * general path must take the call: the fast path is off (tracker.no_fast_path), s is not plain,
 * frees are deferred, or a capture runs on s (the general path adopts it). */
bool weft__stream_ready(weft_stream_t *s, weft_status_t *st);
/** weft__stream_ready's question alone, for a stream the caller found plain (use.c's fast path):
 * true with *st (WEFT_OK, or the failed answer's status) where no capture runs on s now, the
 * driver asked if s is exposed; false where weft__stream_prepare must ready s (a capture runs). */
bool weft__stream_quiet(weft_stream_t *s, weft_status_t *st);
/** Readies s for a call: binds the context and brings its capture state up to date (adopting
 * a capture that code outside weft began on it, dropping one that its owner ended). Costs one
 * driver query for streams outside code can reach, nothing otherwise. */
weft_status_t weft__stream_prepare(weft_stream_t *s);
/** Whether no capture can concern s now: no outside code has seen it, and it takes part in no
 * capture (nor drops one). A foreign capture needs one or the other, so weft__stream_sync_capture
 * then has nothing to do; it asks the tracker and the driver only otherwise. */
static inline bool weft__stream_unseen(const weft_stream_t *s) {
  return !atomic_load_explicit(&s->exposed, memory_order_relaxed) && weft__stream_uncaptured(s);
}
/** weft__stream_prepare without binding the context: for calls whose driver work binds it
 * itself (weft__tracker_use_joint). Its common case (weft__stream_unseen) is inline;
 * weft__stream_sync_capture_slow looks closer. */
weft_status_t weft__stream_sync_capture_slow(weft_stream_t *s);
static inline weft_status_t weft__stream_sync_capture(weft_stream_t *s) {
  return weft__stream_unseen(s) ? WEFT_OK : weft__stream_sync_capture_slow(s);
}
/** Ends the records of the blocks allocated inside capture c and not freed there: their memory
 * went with c's graph (or with its owner's). Their handles become stale; their resource stops
 * counting them. */
void weft__runtime_forget_capture_blocks(weft__capture_t *c);
/** Brings the runtime's view of foreign captures up to date on every exposed stream: adopts the
 * ones code outside weft began, drops the ones their owners ended (so that they stop holding back
 * housekeeping). Call it before host synchronisations, without locks held. */
void weft__runtime_refresh_captures(weft_runtime_t *rt);

/* ---- block.c ------------------------------------------------------------------------------------ */

/** Resolves a live block handle to its record. `fn` names the caller for messages.
 * Errors: INVALID_ARGUMENT (null handle), STALE_HANDLE (freed or reused, runtime released). */
weft_status_t weft__block_check(weft_block_t b, const char *fn, struct weft__block **out);
/** weft__block_check's common case, inline for the per-access loops of uses: the record of a
 * live handle of runtime `rt` (whose liveness the caller checked), or NULL, where the caller
 * runs weft__block_check for the error (or a block of another runtime). */
static inline struct weft__block *weft__block_live(weft_block_t b, const weft_runtime_t *rt) {
  struct weft__block *rec = b.rec;
  if (rec == NULL || weft__block_life(rec) != WEFT__LIFE(b.gen, WEFT__BLOCK_LIVE) || rec->rt != rt) return NULL;
  return rec;
}
/** The one block initialiser: a record for `bytes` tagged `tag` (interned) that `resource` owns,
 * with an empty history and no address yet; not live until weft__block_publish(). NULL when out
 * of host memory. */
struct weft__block *weft__block_make(weft_runtime_t *rt, size_t bytes, const char *tag, weft_resource_t *resource);
/** Publishes a made record as LIVE (a new generation); returns its handle. */
weft_block_t weft__block_publish(struct weft__block *rec);
/** Returns a made but never published record to the FIFO. */
void weft__block_retire(struct weft__block *rec);
/** Ends LIVE block (rec, gen) without calling its resource (its memory went with a graph); does
 * nothing when someone else is freeing it or freed it, or the record holds a later block. */
void weft__block_forget(struct weft__block *rec, uint64_t gen);
/** Claims block (rec, gen) for ending it, LIVE to FREEING in one step (a concurrent weft_free
 * then gets DOUBLE_FREE); false when that block is not live: freed, being freed, or the record
 * holds a later block, which a claim never touches. Give it back with weft__block_unclaim, or end
 * it with weft__block_end. */
bool weft__block_claim(struct weft__block *rec, uint64_t gen);
/** Puts a claimed block back to LIVE (the same generation). */
void weft__block_unclaim(struct weft__block *rec);
void weft__block_end(struct weft__block *rec);

/* ---- cache.c ------------------------------------------------------------------------------------ */

/** Empties the lanes' caches and initialises their locks (once per runtime slot). */
void weft__cache_init(weft_runtime_t *rt);
/** Whether s's cache may keep rec: the cache is on, rec is from the runtime's stack and not
 * larger than the cache (weft__cache_put may still refuse it for the bytes other lanes hold). */
bool weft__cache_accepts(const weft_stream_t *s, const struct weft__block *rec);
/** Keeps claimed block rec, whose free on s (live, prepared, every use waited for) is done as
 * far as ordering goes, in s's cache instead of giving it to its resource; older blocks of s go
 * back to their resource on s to make room. Only for a block weft__cache_accepts took; false
 * (rec untouched) when the other lanes' bytes leave no room. The free restarted rec's history at
 * s's point (weft__tracker_free_kept), so that it can be handed out with no tracker call. */
bool weft__cache_put(weft_stream_t *s, struct weft__block *rec);
/** A block of exactly `bytes` from resource r that s cached, taken out of the cache (state
 * FREEING until the caller publishes it again), or NULL. Its history is that of a block new on
 * s (weft__cache_put). `fast`: the allocation fast path asks (counted in the lane's fast_takes). */
struct weft__block *weft__cache_take(weft_stream_t *s, size_t bytes, weft_resource_t *r, bool fast);
/** Gives every cached block back to its resource on its stream; lanes that take part in a
 * capture (or cannot be used now) keep theirs. Returns the first failure (CAPTURE for a kept lane
 * only when `strict`). */
weft_status_t weft__cache_flush(weft_runtime_t *rt, bool strict);
/** Whether some lane holds a block now (each used lane asked under its lock, where some lane has
 * room): an allocation refused for want of memory flushes the caches and asks again only then. */
bool weft__cache_holds(weft_runtime_t *rt);
/** Forgets every lane's blocks without freeing them (the runtime's release frees them as live
 * records). */
void weft__cache_forget(weft_runtime_t *rt);
/** Every lane's blocks handed out again (*takes) and frees kept (*puts) so far, read under each
 * lane's lock, and the cached blocks and bytes now: weft_runtime_counters' share of the cache. */
void weft__cache_counts(weft_runtime_t *rt, uint64_t *takes, uint64_t *puts, uint64_t *blocks, uint64_t *bytes);

/* ---- use.c -------------------------------------------------------------------------------------- */

/** Runs fn(s, arg), which enqueues work on s, as one use with the accesses: s first waits for
 * what they conflict with, the work is recorded as their newest use (atomically as far as other
 * threads' uses can tell: those of s, or conflicting with it, wait for its enqueue; the rest go
 * on meanwhile), with the counters, the trace's slice and an NVTX range named `name`. The
 * one way every tracked operation of weft (launches, copies, sets, collectives) runs. */
weft_status_t weft__use_run(weft_stream_t *s, const weft_access_t *acc, size_t n, const char *name,
                           weft_status_t (*fn)(weft_stream_t *s, void *arg), void *arg);
/** One use of each of the k distinct streams s[i] with the accesses acc[i][0..n[i]) around one
 * fn(s[0], arg) that enqueues the work of all of them (an NCCL group): each stream first waits
 * for what its accesses conflict with, and afterwards the work is recorded as their newest use on
 * that stream. Each stream is checked (weft__stream_check) and its accesses resolved (blocks of
 * other runtimes welcome, their memory made accessible to s[i]'s device), then
 * weft__use_joint_uses runs the use. */
weft_status_t weft__use_joint(weft_stream_t *const *s, const weft_access_t *const *acc, const size_t *n, size_t k,
                              const char *name, weft_status_t (*fn)(weft_stream_t *s, void *arg), void *arg);
/** weft__use_joint with the accesses resolved by the caller: uses[i][0..n[i]) of live blocks,
 * each use's state a block record's history (&rec->acc: the trace finds the record from it), as
 * weft__uses_from_accesses gives them; a block of another runtime than s[i]'s only where s[i]'s
 * device can access its memory. Checks each stream and meets captures code outside weft began on
 * it (weft__stream_sync_capture). Up to 64 live streams go through weft__tracker_use_joint (no
 * context bound unless a stream gets a wait or a record); when one takes part in a capture or is
 * the calling thread's per-thread stream (or there are more), every stream's use opens, fn runs
 * and the uses close, as weft_use_begin / weft_use_end do. With the trace's slices and an NVTX
 * range named `name`. */
weft_status_t weft__use_joint_uses(weft_stream_t *const *s, weft__use_t *const *uses, const size_t *n, size_t k,
                                   const char *name, weft_status_t (*fn)(weft_stream_t *s, void *arg), void *arg);
/** Resolves accesses to tracker uses; checks every block belongs to s's runtime.
 * `uses` has room for n. */
weft_status_t weft__uses_from_accesses(weft_stream_t *s, const weft_access_t *acc, size_t n, weft__use_t *uses,
                                       const char *fn);

#endif /* WEFT_LIB_RUNTIME_H */
