/* The PyTorch adapter (weft_torch.h): the CUDAPluggableAllocator ABI over weft's public API. */
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/torch/weft_torch.h"
#include "weft/weft.h"

#define MAX_DEVICES 16
#define STREAM_CACHE 8  /* adopted streams remembered per thread */
#define MAX_USE 256     /* accesses of one declared use */
#define HANDLE_BITS 6   /* blocks this thread allocated, by address: 1 << HANDLE_BITS of them */
#define MAX_KEPT 256    /* frees kept to make again per device (kept_t) */
#define MAX_DEFERRED 64 /* captures met away from their begin's thread, per device (on_capture) */

/* A graph pool and the captures that draw from it. Two kinds:
 *   - PyTorch's (hooked): one per PyTorch pool id (MempoolId_t), made at its first
 *     beginAllocateToPool; every capture begun with that id draws from it (graphs captured with
 *     pool=other.pool() share memory, as with PyTorch's allocator). PyTorch counts its uses
 *     (a begin adds one, releasePool takes one); at none, once no tensor allocated from it is
 *     live, the pool is destroyed.
 *   - a capture's own (id 0, 0): a capture weft met with no begin for it (the hooks not set,
 *     code other than torch.cuda.graph): kept until weft_torch_release_graph_pools. */
typedef struct gpool {
  uint64_t id0, id1;          /* PyTorch's pool id; both 0: a capture's own pool */
  weft_graph_pool_t *pool;
  uint64_t capture;           /* the driver's id of the capture drawing from it (0: none yet) */
  weft_stream_t *stream;      /* where weft met that capture */
  bool pending;               /* hooked: between a begin and its end */
  pthread_t begun_by;         /* the thread of that begin (its capture is met on it) */
  unsigned uses;              /* hooked: begins not yet released */
  uint64_t live;              /* hooked: allocations from it that PyTorch has not freed */
  bool tried;                 /* weft_torch_release_graph_pools tried it this call */
  bool retry;                 /* its destroy failed once released: tried again at the next call */
} gpool_t;

/* A free that failed, to make again: PyTorch cannot be told, and a failed weft_free changed
 * nothing (weft.h), so the block stays live until a later call frees it on the same stream. The
 * common case: torch.cuda.graph where a tensor made before the capture dies inside it (`x = f(x)`
 * with x from the warm-up). weft refuses that free (CAPTURE: inside, it would free at every
 * replay), so it waits for the capture's end, as PyTorch's own allocator frees such a block only
 * once no capture is underway. Also a transient failure (host memory, a driver call). */
typedef struct kept {
  CUdeviceptr ptr;
  weft_stream_t *s; /* the stream PyTorch named: the block's untracked work is ordered there */
  CUstream raw;     /* the same, as PyTorch named it (for its recorded streams: declare_recorded) */
} kept_t;

typedef struct device {
  pthread_mutex_t lock;   /* runtime creation, the capture pools and the kept frees */
  /* A recorded free's waits (declare_recorded) hold it read, from their look at `drawing` until
   * they are enqueued; beginAllocateToPool takes it written to count a begun capture. PyTorch
   * begins the capture after that hook returns, so no such wait can land in it. */
  pthread_rwlock_t begin;
  _Atomic(weft_runtime_t *) rt;
  _Atomic(CUcontext) ctx; /* the device's primary context, weft's runtime's (set before rt) */
  gpool_t *pools;         /* n_pools of them (cap_pools room), under lock */
  unsigned n_pools, cap_pools;
  _Atomic unsigned drawing; /* hooked pools with a capture begun and not ended: allocs and frees check them */
  kept_t kept[MAX_KEPT];
  unsigned n_kept;
  /* Captures met on a thread that began none of the waiting PyTorch pools (another thread's
   * empty_cache, kept free, ...): which pool they draw from is chosen at their stream's first
   * allocation, on the capturing thread (claim_deferred). Under lock. */
  struct {
    weft_stream_t *s;
    uint64_t capture;
  } deferred[MAX_DEFERRED];
  unsigned n_deferred;
  _Atomic unsigned deferring; /* n_deferred, readable without the lock */
  _Atomic unsigned retry_destroy; /* a released pool's destroy failed: the next call tries again */
  _Atomic unsigned pending; /* n_kept, readable without the lock: the adapter's calls look first */
  /* allocs and frees: thread_counts_t; these are rare, counted by locked adds */
  _Atomic uint64_t zero_bytes, alloc_failures, free_failures, graph_frees, frees_kept;
} device_t;

static device_t devices[MAX_DEVICES] = {
    [0 ... MAX_DEVICES - 1] = {.lock = PTHREAD_MUTEX_INITIALIZER, .begin = PTHREAD_RWLOCK_INITIALIZER}};
static _Thread_local char last_error[512];
static _Thread_local struct {
  CUstream raw;
  int device;
  weft_stream_t *s;
} cache[STREAM_CACHE];
static _Thread_local unsigned cache_next, cache_last; /* the entry to fill next; the one found last */
/* The handles of blocks this thread allocated, by address, so that their free (PyTorch frees by
 * pointer, mostly on the allocating thread) names the block without weft_free_ptr's lookup in
 * the runtime's address map under its lock. An entry may be stale (the block freed elsewhere, its
 * record handed out again): weft_free then refuses the handle, and the pointer is looked up. */
static _Thread_local struct {
  uintptr_t ptr;
  int device;
  weft_block_t b;
} handles[1u << HANDLE_BITS];

/* ---- the pair's counts -------------------------------------------------------------------------
 * Every allocation and free counts one (weft_torch_stats: adapter_allocs, adapter_frees). A
 * locked add on a word every thread shares was two of the pair's nine locked read-modify-writes
 * (tools/host_instr.sh torch), each a full barrier; so each thread counts in a record of its own,
 * with a plain load and store (only its thread writes it; readers load it atomically), and a read
 * sums the records under counts_lock. A thread's exit (counts_key's destructor) folds its record
 * into `exited` and marks it free for the next thread that counts; records are never released,
 * so a count made after the destructor ran (a tensor freed by another thread-local destructor)
 * lands in a record still listed. */
typedef struct thread_counts {
  _Atomic uint64_t allocs[MAX_DEVICES], frees[MAX_DEVICES];
  bool in_use; /* under counts_lock */
  struct thread_counts *next;
} thread_counts_t;

static pthread_mutex_t counts_lock = PTHREAD_MUTEX_INITIALIZER;
static thread_counts_t *counts_list;                            /* under counts_lock */
static uint64_t exited_allocs[MAX_DEVICES], exited_frees[MAX_DEVICES]; /* under counts_lock */
static pthread_key_t counts_key;
static pthread_once_t counts_once = PTHREAD_ONCE_INIT;
static _Thread_local thread_counts_t *my_counts;

static void counts_exit(void *arg) {
  thread_counts_t *t = arg;
  pthread_mutex_lock(&counts_lock);
  for (unsigned i = 0; i < MAX_DEVICES; i++) {
    exited_allocs[i] += atomic_load_explicit(&t->allocs[i], memory_order_relaxed);
    exited_frees[i] += atomic_load_explicit(&t->frees[i], memory_order_relaxed);
    atomic_store_explicit(&t->allocs[i], 0, memory_order_relaxed);
    atomic_store_explicit(&t->frees[i], 0, memory_order_relaxed);
  }
  t->in_use = false;
  pthread_mutex_unlock(&counts_lock);
  my_counts = NULL;
}

static void counts_key_make(void) {
  if (pthread_key_create(&counts_key, counts_exit) != 0) counts_key = (pthread_key_t)-1;
}

/* The calling thread's record, listed at its first count (NULL: no host memory; the count is
 * then lost, nothing else). */
__attribute__((noinline)) static thread_counts_t *counts_join(void) {
  pthread_once(&counts_once, counts_key_make);
  pthread_mutex_lock(&counts_lock);
  thread_counts_t *t = counts_list;
  while (t != NULL && t->in_use) t = t->next;
  if (t == NULL && (t = calloc(1, sizeof *t)) != NULL) {
    t->next = counts_list;
    counts_list = t;
  }
  if (t != NULL) t->in_use = true;
  pthread_mutex_unlock(&counts_lock);
  /* Without a destructor the record stays in use for good (its counts still read). */
  if (t != NULL && counts_key != (pthread_key_t)-1) (void)pthread_setspecific(counts_key, t);
  return my_counts = t;
}

/* Counts one allocation (frees: false, one free) of `device` on the calling thread. */
static inline void count_pair(int device, bool alloc) {
  thread_counts_t *t = my_counts;
  if (__builtin_expect(t == NULL, 0) && (t = counts_join()) == NULL) return;
  _Atomic uint64_t *c = alloc ? &t->allocs[device] : &t->frees[device];
  atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1, memory_order_relaxed);
}

/* Every thread's allocations (frees: false, frees) of `device` so far. */
static uint64_t counted(int device, bool alloc) {
  pthread_mutex_lock(&counts_lock);
  uint64_t n = alloc ? exited_allocs[device] : exited_frees[device];
  for (thread_counts_t *t = counts_list; t != NULL; t = t->next)
    n += atomic_load_explicit(alloc ? &t->allocs[device] : &t->frees[device], memory_order_relaxed);
  pthread_mutex_unlock(&counts_lock);
  return n;
}

/* ---- record_stream ----------------------------------------------------------------------------
 * The streams recorded for a pointer (weft_torch_record_stream), until its free declares a use
 * on each: a chained table under one lock, its buckets' counts readable without it, so that a
 * free of a pointer nobody recorded (nearly all) costs one load. */
#define REC_BUCKETS 1024
#define REC_STREAMS 8 /* distinct streams recorded for one pointer; more are refused (printed) */

typedef struct recorded {
  uintptr_t ptr;
  unsigned n;
  CUstream streams[REC_STREAMS];
  struct recorded *next;
} recorded_t;

static pthread_mutex_t rec_lock = PTHREAD_MUTEX_INITIALIZER;
static recorded_t *rec_bucket[REC_BUCKETS];
static _Atomic unsigned rec_count[REC_BUCKETS];
static _Atomic uint64_t rec_calls; /* record_stream calls that noted a stream */

static unsigned rec_slot(uintptr_t p) { return (unsigned)(((uint64_t)p * 0x9E3779B97F4A7C15ull) >> 54); }

static unsigned handle_slot(uintptr_t p) { return (unsigned)(((uint64_t)p * 0x9E3779B97F4A7C15ull) >> (64 - HANDLE_BITS)); }
static _Atomic unsigned reported; /* free failures printed so far */

static int fail(int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return status;
}

const char *weft_torch_last_error(void) { return last_error; }
unsigned weft_torch_version(void) { return weft_version(); }

/* The adapter's defaults, before WEFT_* environment overrides: the driver's pool under weft keeps
 * nothing cached (weft's pool is the cache), chunks are 16 MiB, and the device's lanes go to
 * PyTorch's streams. Measured on the example
 * (H100, examples/torch/train.py, 2026-11-26): device memory held 1244 MiB with weft's general
 * defaults, 1148 MiB with release_threshold 0, 1084 MiB with both, PyTorch's allocator 1056 MiB;
 * eager step time within the runs' spread. */
static weft_options_t adapter_options(void) {
  weft_options_t o = weft_options_default();
  o.release_threshold = 0;
  o.pool_chunk_bytes = 16u << 20;
  /* PyTorch's streams are all adopted (its pool holds 32 per priority and device, handed out in
   * turn, so a program that makes torch.cuda.Stream() objects as it goes meets many of them);
   * weft's own pool streams only serve housekeeping here. The process's 128 lanes are shared
   * among the visible devices, at most 64 a runtime (weft.h: stream_count + adopt_streams). */
  int devices = 0;
  CUresult (*init)(unsigned) = (CUresult(*)(unsigned))weft_driver_symbol("cuInit");
  CUresult (*count)(int *) = (CUresult(*)(int *))weft_driver_symbol("cuDeviceGetCount");
  if (init == NULL || count == NULL || init(0) != CUDA_SUCCESS || count(&devices) != CUDA_SUCCESS || devices < 1)
    devices = 1;
  unsigned lanes = 128u / (unsigned)devices;
  lanes = lanes > 64 ? 64 : lanes < 4 ? 4 : lanes;
  o.stream_count = 2;
  o.high_priority_streams = 1;
  o.adopt_streams = lanes - o.stream_count;
  return o;
}

static weft_status_t on_capture(weft_stream_t *s, uint64_t id, void *user);

/* ---- the thread's current context ----------------------------------------------------------
 * Every adapter call leaves the calling thread's current context as it found it. weft makes the
 * device's primary context current for its driver calls (and leaves it so), while PyTorch frees a
 * tensor wherever its last reference dies, whatever device is current there, and keeps its own
 * idea of the current device: left switched, PyTorch's next kernel would run on another device.
 * One cuCtxGetCurrent on the way in; on the way out, only where the context was not the
 * device's, a second and a cuCtxSetCurrent. */
typedef struct ctx_scope {
  CUcontext was;
  bool restore;
} ctx_scope_t;

static CUresult (*ctx_get)(CUcontext *);
static CUresult (*ctx_set)(CUcontext);
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT;
static atomic_bool ctx_resolved; /* ctx_once has run: the calls ask one load, not pthread_once */

static void ctx_resolve(void) {
  ctx_get = (CUresult(*)(CUcontext *))weft_driver_symbol("cuCtxGetCurrent");
  ctx_set = (CUresult(*)(CUcontext))weft_driver_symbol("cuCtxSetCurrent");
  if (ctx_get == NULL || ctx_set == NULL) ctx_get = NULL;
}

static ctx_scope_t ctx_enter(int device) {
  ctx_scope_t sc = {NULL, false};
  if (__builtin_expect(!atomic_load_explicit(&ctx_resolved, memory_order_acquire), 0)) {
    pthread_once(&ctx_once, ctx_resolve);
    atomic_store_explicit(&ctx_resolved, true, memory_order_release);
  }
  if (ctx_get == NULL || ctx_get(&sc.was) != CUDA_SUCCESS) return sc;
  CUcontext mine = device >= 0 && device < MAX_DEVICES ? atomic_load_explicit(&devices[device].ctx, memory_order_acquire) : NULL;
  sc.restore = mine == NULL || sc.was != mine;
  return sc;
}

static void ctx_leave(ctx_scope_t sc) {
  CUcontext now;
  if (sc.restore && ctx_get(&now) == CUDA_SUCCESS && now != sc.was) (void)ctx_set(sc.was);
}

/* The device's primary context (weft's runtime uses it), or NULL. */
static CUcontext primary_of(int device) {
  CUresult (*get)(CUdevice *, int) = (CUresult(*)(CUdevice *, int))weft_driver_symbol("cuDeviceGet");
  CUresult (*retain)(CUcontext *, CUdevice) = (CUresult(*)(CUcontext *, CUdevice))weft_driver_symbol("cuDevicePrimaryCtxRetain");
  CUdevice dev;
  CUcontext c = NULL;
  /* Retained for the process's life, as the runtime it belongs to. */
  if (get == NULL || retain == NULL || get(&dev, device) != CUDA_SUCCESS || retain(&c, dev) != CUDA_SUCCESS) return NULL;
  return c;
}

static weft_runtime_t *runtime_make(int device);

/* The runtime of `device`, made on first use (the adapter's defaults, then the environment). */
static inline weft_runtime_t *runtime_of(int device) {
  weft_runtime_t *rt = device >= 0 && device < MAX_DEVICES ? atomic_load_explicit(&devices[device].rt, memory_order_acquire)
                                                            : NULL;
  return rt != NULL ? rt : runtime_make(device);
}

/* runtime_of's first call for a device (or a device out of range). */
__attribute__((noinline)) static weft_runtime_t *runtime_make(int device) {
  if (device < 0 || device >= MAX_DEVICES) {
    fail(WEFT_ERR_INVALID_ARGUMENT, "weft_torch: device %d out of range (0..%d)", device, MAX_DEVICES - 1);
    return NULL;
  }
  device_t *d = &devices[device];
  weft_runtime_t *rt;
  pthread_mutex_lock(&d->lock);
  rt = atomic_load_explicit(&d->rt, memory_order_relaxed);
  if (rt == NULL) {
    weft_options_t o = adapter_options();
    weft_status_t st = weft_options_from_env(&o);
    if (st == WEFT_OK) st = weft_runtime_get(device, &o, &rt);
    if (st == WEFT_OK && (st = weft_set_capture_handler(rt, on_capture, d)) != WEFT_OK) (void)weft_runtime_release(rt);
    if (st != WEFT_OK) {
      fail(st, "weft_torch: weft_runtime_get(%d): %s", device, weft_last_error());
      rt = NULL;
    } else {
      atomic_store_explicit(&d->ctx, primary_of(device), memory_order_release);
      atomic_store_explicit(&d->rt, rt, memory_order_release);
    }
  }
  pthread_mutex_unlock(&d->lock);
  return rt;
}

/* The weft stream for a PyTorch stream (adopted once; remembered per thread). */
static weft_stream_t *stream_find(weft_runtime_t *rt, int device, CUstream raw);
static inline weft_stream_t *stream_of(weft_runtime_t *rt, int device, CUstream raw) {
  unsigned last = cache_last;
  if (cache[last].raw == raw && cache[last].device == device && cache[last].s != NULL) return cache[last].s;
  return stream_find(rt, device, raw);
}

/* stream_of's look past the entry found last, and the adoption of a stream not remembered. */
__attribute__((noinline)) static weft_stream_t *stream_find(weft_runtime_t *rt, int device, CUstream raw) {
  for (unsigned i = 0; i < STREAM_CACHE; i++)
    if (cache[i].s != NULL && cache[i].raw == raw && cache[i].device == device) {
      cache_last = i;
      return cache[i].s;
    }
  weft_stream_t *s;
  weft_status_t st = weft_stream_adopt(rt, raw, &s);
  if (st != WEFT_OK) {
    fail(st, "weft_torch: weft_stream_adopt: %s", weft_last_error());
    return NULL;
  }
  unsigned k = cache_last = cache_next++ % STREAM_CACHE;
  cache[k].raw = raw;
  cache[k].device = device;
  cache[k].s = s;
  return s;
}

/* A new entry of d->pools (under d->lock), or NULL (no host memory). */
static gpool_t *gpool_add(device_t *d) {
  if (d->n_pools == d->cap_pools) {
    unsigned cap = d->cap_pools ? 2 * d->cap_pools : 8;
    gpool_t *p = realloc(d->pools, cap * sizeof *p);
    if (p == NULL) return NULL;
    d->pools = p;
    d->cap_pools = cap;
  }
  gpool_t *g = &d->pools[d->n_pools++];
  memset(g, 0, sizeof *g);
  return g;
}

/* Asks weft whether s captures: brings weft's view of its capture up to date (an ended capture
 * lets go of its graph pool). */
static void refresh_capture(weft_stream_t *s) {
  int capturing = 0;
  if (weft_stream_is_capturing(s, &capturing) != WEFT_OK) capturing = 0;
  (void)capturing;
}

static gpool_t *gpool_by_id(device_t *d, uint64_t id0, uint64_t id1) {
  for (unsigned i = 0; i < d->n_pools; i++)
    if (d->pools[i].id0 == id0 && d->pools[i].id1 == id1 && (id0 | id1) != 0) return &d->pools[i];
  return NULL;
}

/* weft met a capture begun outside weft on s: allocations inside it go to a graph pool, as
 * PyTorch's private pools do. The pool of the PyTorch begin waiting on this thread (CUDAGraph
 * calls beginAllocateToPool, then cuStreamBeginCapture, on one thread), else of the only begin
 * waiting on the device, else the capture's own. weft asks the driver once per call; the
 * adapter asks nothing. */
/* Forgets the deferred capture of s, if any (under d->lock). */
static void undefer(device_t *d, weft_stream_t *s) {
  for (unsigned i = 0; i < d->n_deferred; i++)
    if (d->deferred[i].s == s) {
      d->deferred[i] = d->deferred[--d->n_deferred];
      atomic_store_explicit(&d->deferring, d->n_deferred, memory_order_release);
      return;
    }
}

/* Notes capture `id` of s as met with no pool chosen yet (under d->lock); false: no room. */
static bool defer(device_t *d, weft_stream_t *s, uint64_t id) {
  undefer(d, s);
  if (d->n_deferred == MAX_DEFERRED) return false;
  d->deferred[d->n_deferred].s = s;
  d->deferred[d->n_deferred].capture = id;
  d->n_deferred++;
  atomic_store_explicit(&d->deferring, d->n_deferred, memory_order_release);
  return true;
}

/* Chooses the graph pool of capture `id` met on s and tells weft (see on_capture). `may_defer`:
 * met on a thread that began none of the waiting PyTorch pools while some wait: the choice waits
 * for the stream's first allocation (claim_deferred), made on the capturing thread (PyTorch
 * allocates there): here it could only guess, and a wrong guess gives the capture a pool that
 * no release_pool ever destroys (tests/torch test_torch_pools, captures met on another thread). */
static weft_status_t assign_pool(device_t *d, weft_stream_t *s, uint64_t id, bool may_defer) {
  weft_runtime_t *rt = atomic_load_explicit(&d->rt, memory_order_acquire);
  weft_status_t st = WEFT_OK;
  pthread_mutex_lock(&d->lock);
  gpool_t *g = NULL, *only = NULL;
  unsigned waiting = 0;
  for (unsigned i = 0; i < d->n_pools && g == NULL; i++) {
    gpool_t *e = &d->pools[i];
    if (e->capture == id) g = e; /* met before (on another stream it was forked onto) */
    else if (e->pending && e->capture == 0) {
      waiting++;
      only = e;
      if (pthread_equal(e->begun_by, pthread_self())) g = e;
    }
  }
  undefer(d, s);
  if (g == NULL && waiting != 0 && may_defer && defer(d, s, id)) {
    pthread_mutex_unlock(&d->lock);
    return WEFT_OK;
  }
  if (g == NULL && waiting == 1) g = only;
  if (g == NULL && (g = gpool_add(d)) == NULL) {
    pthread_mutex_unlock(&d->lock);
    return fail(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_torch: no host memory for a graph pool's entry");
  }
  /* On a failure the choice is made again at the stream's next allocation (defer): weft would
   * otherwise serve the capture's later allocations from graph memory nodes, whose memory a
   * graph PyTorch owns keeps with no one to free it (tests/torch test_torch_pools: a fault in
   * the capture handler leaked the output's device memory). */
  if (g->pool == NULL && (st = weft_graph_pool_create(rt, &g->pool)) != WEFT_OK) {
    if ((g->id0 | g->id1) == 0) d->n_pools--; /* the new entry (the last) */
    fail(st, "weft_torch: weft_graph_pool_create: %s", weft_last_error());
    (void)defer(d, s, id);
    pthread_mutex_unlock(&d->lock);
    return st;
  }
  if (g->capture != id) {
    g->capture = id;
    g->stream = s;
  }
  weft_graph_pool_t *p = g->pool;
  bool own = (g->id0 | g->id1) == 0;
  pthread_mutex_unlock(&d->lock);
  st = weft_capture_allocate_to(s, p);
  if (st == WEFT_OK) return st;
  fail(st, "weft_torch: weft_capture_allocate_to: %s", weft_last_error());
  pthread_mutex_lock(&d->lock);
  (void)defer(d, s, id);
  /* A capture's own pool that no capture draws from (the capture had ended: a handler run for a
   * capture its owner ended meanwhile) goes now: before, it stayed until
   * weft_torch_release_graph_pools, which PyTorch never calls (test_torch_pools, eight threads:
   * "1 graph pools left"). Only while nothing else took it up (another stream of the same capture
   * met meanwhile draws from it: the destroy says BUSY and it is put back). */
  bool drop = false;
  for (unsigned i = 0; own && i < d->n_pools && !drop; i++)
    if (d->pools[i].pool == p && d->pools[i].capture == id && (d->pools[i].id0 | d->pools[i].id1) == 0) {
      d->pools[i] = d->pools[--d->n_pools];
      drop = true;
    }
  pthread_mutex_unlock(&d->lock);
  if (drop && weft_graph_pool_destroy(p) != WEFT_OK) {
    pthread_mutex_lock(&d->lock);
    gpool_t *e = gpool_add(d);
    if (e != NULL) *e = (gpool_t){.pool = p, .capture = id, .stream = s};
    pthread_mutex_unlock(&d->lock);
  }
  return st; /* last_error: the allocate_to's (the destroy leaves it) */
}

static weft_status_t on_capture(weft_stream_t *s, uint64_t id, void *user) { return assign_pool(user, s, id, true); }

/* The driver's capture query of a raw stream (the id's position is the same in every version of
 * cuStreamGetCaptureInfo; every argument after it is passed NULL), or NULL. The versioned entry
 * points first: the simulator exports only cuStreamGetCaptureInfo_v3 (cuda.h's name for it), and
 * with the bare name alone ensure_pool was never run there (test_torch_pools, eight threads: the
 * capturing thread's allocation met a capture another thread's handler was deferring). */
typedef CUresult (*capture_info_fn)(CUstream, CUstreamCaptureStatus *, cuuint64_t *, void *, void *, void *, void *);
static capture_info_fn capture_info;
static pthread_once_t capture_info_once = PTHREAD_ONCE_INIT;
static void capture_info_resolve(void) {
  static const char *const names[] = {"cuStreamGetCaptureInfo_v3", "cuStreamGetCaptureInfo_v2", "cuStreamGetCaptureInfo"};
  for (unsigned i = 0; i < sizeof names / sizeof names[0] && capture_info == NULL; i++)
    capture_info = (capture_info_fn)weft_driver_symbol(names[i]);
}

/* The id of the capture raw takes part in now, or 0 (none, or the driver cannot say). */
static uint64_t capture_id_of(CUstream raw) {
  if (raw == NULL || raw == CU_STREAM_LEGACY) return 0;
  pthread_once(&capture_info_once, capture_info_resolve);
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  if (capture_info == NULL || capture_info(raw, &cs, &id, NULL, NULL, NULL, NULL) != CUDA_SUCCESS ||
      cs != CU_STREAM_CAPTURE_STATUS_ACTIVE)
    return 0;
  return id;
}

/* Before an allocation on s (PyTorch's stream raw) while PyTorch pools wait for captures: if s
 * takes part in a capture, the pool it draws from is made sure of here, on the allocating
 * thread, not left to weft's capture handler: that runs on whichever thread meets the capture
 * first, and while it runs on another thread (another thread's empty_cache, a kept free, a
 * record_stream's free on this stream) weft lets this thread's allocation go on without a pool:
 * a graph memory node, which the graph PyTorch owns never frees (cuGraphLaunch then refuses a
 * second replay), and a pool that never learns of its tensor (test_torch_pools, eight threads).
 * The capture draws from the pool of the capture id met before (a fork), else of the begin
 * waiting on this thread; else the handler's choice stands. */
static weft_status_t ensure_pool(device_t *d, weft_runtime_t *rt, weft_stream_t *s, CUstream raw) {
  uint64_t id = capture_id_of(raw);
  if (id == 0) return WEFT_OK; /* none (weft's own call says what is wrong, if anything) */
  weft_status_t st = WEFT_OK;
  pthread_mutex_lock(&d->lock);
  gpool_t *g = NULL;
  for (unsigned i = 0; i < d->n_pools && g == NULL; i++)
    if (d->pools[i].capture == id) g = &d->pools[i];
  for (unsigned i = 0; i < d->n_pools && g == NULL; i++) {
    gpool_t *e = &d->pools[i];
    if (e->pending && e->capture == 0 && pthread_equal(e->begun_by, pthread_self())) g = e;
  }
  if (g == NULL) {
    pthread_mutex_unlock(&d->lock);
    return WEFT_OK;
  }
  if (g->pool == NULL && (st = weft_graph_pool_create(rt, &g->pool)) != WEFT_OK) {
    pthread_mutex_unlock(&d->lock);
    return fail(st, "weft_torch: weft_graph_pool_create: %s", weft_last_error());
  }
  if (g->capture != id) {
    g->capture = id;
    g->stream = s;
  }
  undefer(d, s);
  weft_graph_pool_t *p = g->pool;
  pthread_mutex_unlock(&d->lock);
  st = weft_capture_allocate_to(s, p); /* nothing when said before */
  return st == WEFT_OK ? st : fail(st, "weft_torch: weft_capture_allocate_to: %s", weft_last_error());
}

/* Before an allocation on s (PyTorch's stream raw) while PyTorch pools wait for captures: weft
 * meets the capture s takes part in, if any, now, before claim_deferred looks for a deferred
 * choice. weft_alloc would meet it only after that look: its handler, run there (on a thread
 * that began none of the waiting pools) or on another thread that adopted the capture meanwhile
 * (weft_alloc then waits for it: lib/runtime/stream.c wait_handled), deferred the choice, and
 * the allocation went on with no pool: a graph memory node (test_torch_pools, eight threads, and
 * test_a_deferred_pool_choice_met_inside_the_first_allocation). Then ensure_pool. */
static weft_status_t meet_capture(device_t *d, weft_runtime_t *rt, weft_stream_t *s, CUstream raw) {
  if (raw == NULL || raw == CU_STREAM_LEGACY) return WEFT_OK; /* the legacy stream never captures */
  int capturing = 0;
  weft_status_t st = weft_stream_is_capturing(s, &capturing);
  if (st != WEFT_OK) return fail(st, "weft_torch: weft_stream_is_capturing: %s", weft_last_error());
  return capturing ? ensure_pool(d, rt, s, raw) : WEFT_OK;
}

/* Before an allocation on s: a capture on s met on another thread (deferred by assign_pool) gets
 * its pool now, on this thread. Asking weft first brings its view of s up to date (a newer
 * capture met now replaces the deferred one; an ended one is dropped). */
static weft_status_t claim_deferred(device_t *d, weft_stream_t *s) {
  if (atomic_load_explicit(&d->deferring, memory_order_acquire) == 0) return WEFT_OK;
  bool found = false;
  pthread_mutex_lock(&d->lock);
  for (unsigned i = 0; i < d->n_deferred && !found; i++) found = d->deferred[i].s == s;
  pthread_mutex_unlock(&d->lock);
  if (!found) return WEFT_OK;
  int capturing = 0;
  weft_status_t st = weft_stream_is_capturing(s, &capturing);
  if (st != WEFT_OK) return fail(st, "weft_torch: weft_stream_is_capturing: %s", weft_last_error());
  uint64_t id = 0;
  found = false;
  pthread_mutex_lock(&d->lock);
  for (unsigned i = 0; i < d->n_deferred && !found; i++)
    if (d->deferred[i].s == s) {
      found = true;
      id = d->deferred[i].capture;
    }
  if (found && !capturing) undefer(d, s);
  pthread_mutex_unlock(&d->lock);
  if (!found || !capturing) return WEFT_OK;
  /* A handler may have met an ended capture (another thread asked the driver just before its
   * owner ended it, and adopted it once the owner's end hook had dropped it): its deferral names
   * that capture, not the one s takes part in now. The current one is chosen for. */
  uint64_t now = capture_id_of(weft_stream_raw(s));
  return assign_pool(d, s, now != 0 ? now : id, false);
}

/* CUDAGraph::capture_begin's beginAllocateToPool: the next capture met on this thread (see
 * on_capture) draws from PyTorch pool `id`'s graph pool. The pool is made when the capture is
 * met (on_capture). PyTorch begins the capture right after this hook: the points weft left
 * pending on PyTorch's streams (frees, allocations) are recorded now, or the capture's stream
 * could not give them to other streams until it ends (weft_runtime_record_pending). */
void weft_torch_begin_allocate_to_pool(int device, weft_torch_mempool_id_t id, const void *filter) {
  (void)filter; /* which streams: those of the capture begun next on this thread (on_capture) */
  if (device < 0 || device >= MAX_DEVICES || (id.first | id.second) == 0) return;
  device_t *d = &devices[device];
  weft_runtime_t *rt = atomic_load_explicit(&d->rt, memory_order_acquire);
  if (rt != NULL && weft_runtime_record_pending(rt) != WEFT_OK && atomic_fetch_add(&reported, 1) < 10)
    fprintf(stderr, "weft_torch: weft_runtime_record_pending(%d): %s\n", device, weft_last_error());
  pthread_rwlock_wrlock(&d->begin); /* recorded frees' waits enqueued meanwhile finish first */
  pthread_mutex_lock(&d->lock);
  gpool_t *g = gpool_by_id(d, id.first, id.second);
  if (g == NULL && (g = gpool_add(d)) != NULL) {
    g->id0 = id.first;
    g->id1 = id.second;
  }
  if (g != NULL) {
    g->uses++;
    if (!g->pending) atomic_fetch_add_explicit(&d->drawing, 1, memory_order_relaxed);
    g->pending = true;
    g->begun_by = pthread_self();
    g->capture = 0; /* the capture begun next */
  }
  pthread_mutex_unlock(&d->lock);
  pthread_rwlock_unlock(&d->begin);
  if (g == NULL) {
    fail(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_torch: no host memory for a graph pool's entry");
    if (atomic_fetch_add(&reported, 1) < 10) fprintf(stderr, "%s\n", last_error);
  }
}

/* Destroys the graph pools of d that nothing holds any more: PyTorch released them and no tensor
 * from them is live (run with no lock held: a destroy waits for the device). The capture that
 * drew from one last may not be seen ended yet: asking its stream brings it up to date. */
static void destroy_released(int device, device_t *d) {
  for (;;) {
    weft_graph_pool_t *p = NULL;
    weft_stream_t *s = NULL;
    bool found = false;
    pthread_mutex_lock(&d->lock);
    for (unsigned i = 0; i < d->n_pools && !found; i++) {
      gpool_t *g = &d->pools[i];
      if (!g->retry && ((g->id0 | g->id1) == 0 || g->uses != 0 || g->live != 0 || g->pending)) continue;
      found = true;
      p = g->pool; /* NULL: no capture drew from it (torch.cuda.use_mem_pool outside captures) */
      s = g->stream;
      d->pools[i] = d->pools[--d->n_pools];
    }
    pthread_mutex_unlock(&d->lock);
    if (!found) return;
    if (p == NULL) continue;
    if (s != NULL) refresh_capture(s);
    weft_status_t st = weft_graph_pool_destroy(p);
    if (st != WEFT_OK) {
      fail(st, "weft_torch: releasing a graph pool of device %d: %s", device, weft_last_error());
      if (atomic_fetch_add(&reported, 1) < 10) fprintf(stderr, "%s\n", last_error);
      /* Kept as a capture's own, to destroy again at the device's next adapter call (PyTorch
       * never calls weft_torch_release_graph_pools, which also tries it): before, a failure
       * here (a cuMemFree or the wait failing once) kept the pool for good
       * (test_torch_pools, faults in a hooked capture: cuMemFree:1). */
      pthread_mutex_lock(&d->lock);
      gpool_t *g = gpool_add(d);
      if (g != NULL) {
        g->pool = p;
        g->stream = s;
        g->retry = true;
        atomic_store_explicit(&d->retry_destroy, 1, memory_order_release);
      }
      pthread_mutex_unlock(&d->lock);
      return;
    }
  }
}

/* CUDAGraph::capture_end's endAllocateToPool (after the capture ended): pool `id` serves no
 * capture now. The capture's stream is asked once, so that weft lets go of the pool at once (a
 * later capture may draw from it). */
void weft_torch_end_allocate_to_pool(int device, weft_torch_mempool_id_t id) {
  if (device < 0 || device >= MAX_DEVICES) return;
  device_t *d = &devices[device];
  weft_stream_t *s = NULL;
  pthread_mutex_lock(&d->lock);
  gpool_t *g = gpool_by_id(d, id.first, id.second);
  if (g != NULL && g->pending) {
    g->pending = false;
    atomic_fetch_sub_explicit(&d->drawing, 1, memory_order_relaxed);
    s = g->stream;
    g->capture = 0;
  }
  pthread_mutex_unlock(&d->lock);
  if (s != NULL) {
    ctx_scope_t sc = ctx_enter(device);
    refresh_capture(s);
    ctx_leave(sc);
  }
}

/* CUDAGraph::reset's releasePool (the graph deleted or reset): one use of pool `id` less; at
 * none, its graph pool goes once its last tensor is freed (now if none is live). */
void weft_torch_release_pool(int device, weft_torch_mempool_id_t id) {
  if (device < 0 || device >= MAX_DEVICES) return;
  device_t *d = &devices[device];
  pthread_mutex_lock(&d->lock);
  gpool_t *g = gpool_by_id(d, id.first, id.second);
  if (g != NULL && g->uses != 0) g->uses--;
  pthread_mutex_unlock(&d->lock);
  ctx_scope_t sc = ctx_enter(device);
  destroy_released(device, d);
  ctx_leave(sc);
}

/* The hooked pool of d drawn from by a capture now under way that holds ptr, or NULL (under
 * d->lock). Only while d->drawing: a capture's allocations and frees count its live tensors. */
static gpool_t *drawing_pool_of(device_t *d, CUdeviceptr ptr) {
  for (unsigned i = 0; i < d->n_pools; i++) {
    gpool_t *g = &d->pools[i];
    if (g->pending && g->pool != NULL && weft_graph_pool_owns(g->pool, ptr)) return g;
  }
  return NULL;
}

static inline weft_status_t declare_recorded(weft_runtime_t *rt, int device, uintptr_t ptr, CUstream on,
                                            weft_stream_t *fs);

static bool graph_free(int device, device_t *d, CUdeviceptr ptr);

/* Keeps a failed free of ptr on s to make again (false when MAX_KEPT are kept already); `again`:
 * one kept before (frees_kept counts each free once). */
static bool keep_free(device_t *d, CUdeviceptr ptr, weft_stream_t *s, CUstream raw, bool again) {
  pthread_mutex_lock(&d->lock);
  bool room = d->n_kept < MAX_KEPT;
  if (room) {
    d->kept[d->n_kept++] = (kept_t){ptr, s, raw};
    atomic_store_explicit(&d->pending, d->n_kept, memory_order_release);
    if (!again) atomic_fetch_add_explicit(&d->frees_kept, 1, memory_order_relaxed);
  }
  pthread_mutex_unlock(&d->lock);
  return room;
}

/* Makes the kept frees of d again (each adapter call on the device does, first): those that fail
 * again stay kept (a capture still running, a fault still there), except a pointer that is no
 * longer a live block, which is counted as a failure and dropped. The list is taken out under the
 * lock and the frees run without it: a free may meet a capture and call on_capture, which locks. */
static void destroy_released(int device, device_t *d);

static void flush_kept_now(weft_runtime_t *rt, device_t *d);

static inline void flush_kept(weft_runtime_t *rt, device_t *d) {
  if (atomic_load_explicit(&d->retry_destroy, memory_order_acquire) != 0 ||
      atomic_load_explicit(&d->pending, memory_order_acquire) != 0)
    flush_kept_now(rt, d);
}

/* flush_kept's work, where there is some. */
__attribute__((noinline)) static void flush_kept_now(weft_runtime_t *rt, device_t *d) {
  if (atomic_load_explicit(&d->retry_destroy, memory_order_acquire) != 0 &&
      atomic_exchange_explicit(&d->retry_destroy, 0, memory_order_acq_rel) != 0)
    destroy_released((int)(d - devices), d); /* sets it again if a destroy fails again */
  if (atomic_load_explicit(&d->pending, memory_order_acquire) == 0) return;
  kept_t todo[MAX_KEPT];
  pthread_mutex_lock(&d->lock);
  unsigned n = d->n_kept;
  memcpy(todo, d->kept, n * sizeof todo[0]);
  d->n_kept = 0;
  atomic_store_explicit(&d->pending, 0, memory_order_release);
  pthread_mutex_unlock(&d->lock);
  for (unsigned i = 0; i < n; i++) {
    weft_status_t st = declare_recorded(rt, (int)(d - devices), (uintptr_t)todo[i].ptr, todo[i].raw, todo[i].s);
    if (st == WEFT_OK) st = weft_free_ptr(rt, todo[i].ptr, todo[i].s);
    if (st == WEFT_OK) {
      count_pair((int)(d - devices), false);
    } else if (st == WEFT_ERR_INVALID_ARGUMENT && graph_free((int)(d - devices), d, todo[i].ptr)) {
      /* memory a graph kept (a tensor of a graph pool, record_stream'ed, freed while a capture
       * ran): its pool counts one live tensor less, as in free_here; before, the free was dropped
       * as a failure and the pool never destroyed (test_torch_pools) */
      atomic_fetch_add_explicit(&d->graph_frees, 1, memory_order_relaxed);
    } else if (st == WEFT_ERR_INVALID_ARGUMENT || st == WEFT_ERR_STALE_HANDLE || st == WEFT_ERR_DOUBLE_FREE ||
               !keep_free(d, todo[i].ptr, todo[i].s, todo[i].raw, true)) {
      fail(st, "weft_torch: kept free(0x%llx): %s", (unsigned long long)todo[i].ptr, weft_last_error());
      atomic_fetch_add_explicit(&d->free_failures, 1, memory_order_relaxed);
      if (atomic_fetch_add(&reported, 1) < 10) fprintf(stderr, "%s\n", last_error);
    }
  }
}

/* PyTorch's CUDAPluggableAllocator does not look at what alloc returns: a NULL for a non-empty
 * tensor becomes a tensor at address 0, whose first kernel faults (an illegal address: the CUDA
 * context is lost; seen on an H100 with PyTorch 2.11, bench/data/h100x2-a97ce09). So inside
 * PyTorch a failed allocation throws a C++ std::runtime_error with weft's message through
 * PyTorch's C++ frames, which Python sees as RuntimeError, as RMM's PyTorch allocator throws: the
 * exception is made with the C++ runtime's ABI (__cxa_allocate_exception, the runtime_error
 * constructor, __cxa_throw) found in the libstdc++ PyTorch loaded. The frames it leaves hold
 * nothing to clean up (no lock, no memory) and have unwind tables (BUILD). Where
 * PyTorch (libc10.so) or libstdc++ is not loaded, a C program, it returns and alloc gives NULL. */
static void raise_in_pytorch(const char *msg) {
  void *c10 = dlopen("libc10.so", RTLD_LAZY | RTLD_NOLOAD);
  void *cxx = c10 != NULL ? dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_NOLOAD) : NULL;
  if (c10 != NULL) dlclose(c10); /* NOLOAD handles only count references */
  if (cxx == NULL) return;
  void *(*allocate)(size_t) = (void *(*)(size_t))dlsym(cxx, "__cxa_allocate_exception");
  void (*construct)(void *, const char *) = (void (*)(void *, const char *))dlsym(cxx, "_ZNSt13runtime_errorC1EPKc");
  void (*destruct)(void *) = (void (*)(void *))dlsym(cxx, "_ZNSt13runtime_errorD1Ev");
  void *type = dlsym(cxx, "_ZTISt13runtime_error");
  void (*raise)(void *, void *, void (*)(void *)) = (void (*)(void *, void *, void (*)(void *)))dlsym(cxx, "__cxa_throw");
  dlclose(cxx);
  if (allocate == NULL || construct == NULL || destruct == NULL || type == NULL || raise == NULL) return;
  void *e = allocate(64); /* a std::runtime_error is 16 bytes in libstdc++ (vptr, string) */
  construct(e, msg);
  raise(e, type, destruct); /* does not return */
}

static void *alloc_or_null(ssize_t size, int device, CUstream stream);
static void count_drawn(device_t *d, CUdeviceptr ptr, int delta);

void *weft_torch_alloc(ssize_t size, int device, CUstream stream) {
  ctx_scope_t sc = ctx_enter(device);
  void *p = alloc_or_null(size, device, stream);
  ctx_leave(sc);
  if (p == NULL && size > 0) raise_in_pytorch(last_error);
  return p;
}

/* weft_torch_alloc's work: the memory, or NULL (last_error says why; a 0-byte request). */
static void *alloc_or_null(ssize_t size, int device, CUstream stream) {
  weft_runtime_t *rt = runtime_of(device);
  if (rt == NULL) return NULL;
  device_t *d = &devices[device];
  flush_kept(rt, d);
  if (size <= 0) {
    atomic_fetch_add_explicit(&d->zero_bytes, 1, memory_order_relaxed);
    return NULL;
  }
  weft_stream_t *s = stream_of(rt, device, stream);
  weft_block_t b;
  weft_status_t st = s == NULL ? WEFT_ERR_INVALID_ARGUMENT : WEFT_OK;
  if (st == WEFT_OK && atomic_load_explicit(&d->drawing, memory_order_relaxed) != 0) st = meet_capture(d, rt, s, stream);
  if (st == WEFT_OK) st = claim_deferred(d, s);
  if (st == WEFT_OK && (st = weft_alloc(rt, (size_t)size, s, "torch", &b)) != WEFT_OK)
    fail(st, "weft_torch: weft_alloc(%zd): %s", size, weft_last_error());
  CUdeviceptr p = 0;
  if (st == WEFT_OK && weft_block_ptr(b, &p) != WEFT_OK) st = WEFT_ERR_STALE_HANDLE;
  if (st != WEFT_OK) {
    atomic_fetch_add_explicit(&d->alloc_failures, 1, memory_order_relaxed);
    return NULL;
  }
  count_pair(device, true);
  if (atomic_load_explicit(&d->drawing, memory_order_relaxed) != 0) count_drawn(d, p, +1);
  unsigned k = handle_slot((uintptr_t)p);
  handles[k].ptr = (uintptr_t)p;
  handles[k].device = device;
  handles[k].b = b;
  return (void *)(uintptr_t)p;
}

/* A free of memory a captured graph kept (a graph pool of d holds ptr; weft no longer knows the
 * block): nothing to free, the graph owns it; its pool's live tensors count one less. Whether a
 * pool holds ptr. */
static bool graph_free(int device, device_t *d, CUdeviceptr ptr) {
  pthread_mutex_lock(&d->lock);
  gpool_t *g = NULL;
  for (unsigned i = 0; i < d->n_pools && g == NULL; i++)
    if (d->pools[i].pool != NULL && weft_graph_pool_owns(d->pools[i].pool, ptr)) g = &d->pools[i];
  bool last = g != NULL && g->live != 0 && --g->live == 0 && g->uses == 0;
  pthread_mutex_unlock(&d->lock);
  if (last) destroy_released(device, d);
  return g != NULL;
}

/* While a PyTorch capture draws from a pool of d: the live count of the pool holding ptr changes
 * by `delta` (an allocation inside the capture, or a free of one). */
static void count_drawn(device_t *d, CUdeviceptr ptr, int delta) {
  pthread_mutex_lock(&d->lock);
  gpool_t *g = drawing_pool_of(d, ptr);
  if (g != NULL && (delta > 0 || g->live != 0)) g->live += (uint64_t)(int64_t)delta;
  pthread_mutex_unlock(&d->lock);
}

static void free_here(void *ptr, int device, CUstream stream);

void weft_torch_free(void *ptr, ssize_t size, int device, CUstream stream) {
  (void)size;
  if (ptr == NULL) return;
  ctx_scope_t sc = ctx_enter(device);
  free_here(ptr, device, stream);
  ctx_leave(sc);
}

/* weft_torch_free's work (the context is put back by the caller). */
static void free_here(void *ptr, int device, CUstream stream) {
  weft_runtime_t *rt = runtime_of(device);
  if (rt == NULL) return;
  device_t *d = &devices[device];
  flush_kept(rt, d);
  weft_stream_t *s = stream_of(rt, device, stream);
  weft_status_t st = WEFT_ERR_STALE_HANDLE;
  unsigned k = handle_slot((uintptr_t)ptr);
  weft_status_t declared = s != NULL ? declare_recorded(rt, device, (uintptr_t)ptr, stream, s) : WEFT_OK;
  if (declared != WEFT_OK) st = declared; /* the free is kept, with its record */
  else if (s != NULL && handles[k].ptr == (uintptr_t)ptr && handles[k].device == device) {
    handles[k].ptr = 0;
    st = weft_free(handles[k].b, s);
  }
  /* Not this thread's, or no longer the block its handle named: by pointer. */
  if (declared == WEFT_OK && (st == WEFT_ERR_STALE_HANDLE || st == WEFT_ERR_DOUBLE_FREE))
    st = s == NULL ? WEFT_ERR_INVALID_ARGUMENT : weft_free_ptr(rt, (CUdeviceptr)(uintptr_t)ptr, s);
  if (st == WEFT_OK) {
    count_pair(device, false);
    /* A tensor allocated inside a PyTorch capture, freed inside it: its range is free again
     * (freed memory of a pool can never be handed to another pool meanwhile: it stays reserved). */
    if (atomic_load_explicit(&d->drawing, memory_order_relaxed) != 0) count_drawn(d, (CUdeviceptr)(uintptr_t)ptr, -1);
    return;
  }
  if (st == WEFT_ERR_INVALID_ARGUMENT && graph_free(device, d, (CUdeviceptr)(uintptr_t)ptr)) {
    atomic_fetch_add_explicit(&d->graph_frees, 1, memory_order_relaxed);
    return;
  }
  fail(st, "weft_torch: free(%p) on device %d: %s", ptr, device, s ? weft_last_error() : last_error);
  /* A live block whose free failed: made again by a later call (kept_t). A capture's refusal is
   * no failure: the free waits for the capture's end. */
  bool kept = s != NULL && st != WEFT_ERR_INVALID_ARGUMENT && st != WEFT_ERR_STALE_HANDLE &&
              st != WEFT_ERR_DOUBLE_FREE && keep_free(d, (CUdeviceptr)(uintptr_t)ptr, s, stream, false);
  if (kept && st == WEFT_ERR_CAPTURE) return;
  atomic_fetch_add_explicit(&d->free_failures, 1, memory_order_relaxed);
  if (atomic_fetch_add(&reported, 1) < 10) fprintf(stderr, "%s%s\n", last_error, kept ? " (kept: made again later)" : "");
}

void weft_torch_record_stream(void *ptr, CUstream stream) {
  uintptr_t p = (uintptr_t)ptr;
  if (p == 0) return;
  unsigned b = rec_slot(p);
  bool full = false;
  pthread_mutex_lock(&rec_lock);
  recorded_t *r = rec_bucket[b];
  while (r != NULL && r->ptr != p) r = r->next;
  if (r == NULL && (r = calloc(1, sizeof *r)) != NULL) {
    r->ptr = p;
    r->next = rec_bucket[b];
    rec_bucket[b] = r;
    atomic_fetch_add_explicit(&rec_count[b], 1, memory_order_release);
  }
  unsigned i = 0;
  while (r != NULL && i < r->n && r->streams[i] != stream) i++;
  if (r != NULL && i == r->n) {
    if (r->n < REC_STREAMS) r->streams[r->n++] = stream;
    else full = true;
  }
  pthread_mutex_unlock(&rec_lock);
  if (r == NULL || full) {
    fail(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_torch: record_stream(%p): %s", ptr,
         r == NULL ? "no host memory" : "more than 8 streams recorded for one tensor");
    if (atomic_fetch_add(&reported, 1) < 10) fprintf(stderr, "%s\n", last_error);
    return;
  }
  atomic_fetch_add_explicit(&rec_calls, 1, memory_order_relaxed);
}

/* A free refused while its stream or a stream recorded for it captures (a wait there on work
 * outside the capture would invalidate it): kept until the capture ends (kept_t). */
static weft_status_t kept_for_capture(uintptr_t ptr) {
  return fail(WEFT_ERR_CAPTURE, "weft_torch: free(0x%llx): a stream recorded for it or its own captures: kept until "
              "the capture ends", (unsigned long long)ptr);
}

/* ---- a recorded stream, of any device ---------------------------------------------------------
 * A stream recorded for a tensor may belong to another device than the tensor (a peer copy on
 * device 1's stream reads a device-0 tensor; PyTorch's allocator records its event there under a
 * device guard). An event is recorded only on a stream of its own context's device, so the
 * stream's device is found by recording: an event of the free's device first, then of each other
 * device (the driver refuses an event of another context with INVALID_HANDLE). The recorded
 * stream is not adopted: weft tracks the free's stream only, and it imports the event. Before,
 * the stream was adopted into the tensor's device's runtime and weft_stream_import_stream
 * recorded an event of that device on it: every such free failed (cuEventRecord
 * INVALID_HANDLE), was kept and failed again at every later call, and its memory never came
 * back (tests/torch test_torch_threads_2, test_record_stream_of_another_device). */
typedef struct rec_driver {
  CUresult (*event_create)(CUevent *, unsigned);
  CUresult (*event_record)(CUevent, CUstream);
  CUresult (*event_destroy)(CUevent);
  CUresult (*is_capturing)(CUstream, CUstreamCaptureStatus *);
  int devices;
  _Atomic(CUcontext) primary[MAX_DEVICES];
} rec_driver_t;

static rec_driver_t rec_drv;
static pthread_once_t rec_drv_once = PTHREAD_ONCE_INIT;

static void rec_drv_resolve(void) {
  rec_drv.event_create = (CUresult(*)(CUevent *, unsigned))weft_driver_symbol("cuEventCreate");
  rec_drv.event_record = (CUresult(*)(CUevent, CUstream))weft_driver_symbol("cuEventRecord");
  rec_drv.event_destroy = (CUresult(*)(CUevent))weft_driver_symbol("cuEventDestroy_v2");
  rec_drv.is_capturing = (CUresult(*)(CUstream, CUstreamCaptureStatus *))weft_driver_symbol("cuStreamIsCapturing");
  CUresult (*count)(int *) = (CUresult(*)(int *))weft_driver_symbol("cuDeviceGetCount");
  int n = 0;
  if (count == NULL || count(&n) != CUDA_SUCCESS || n < 1) n = 1;
  rec_drv.devices = n > MAX_DEVICES ? MAX_DEVICES : n;
}

/* Device d's primary context (retained once for the process's life), or NULL. */
static CUcontext context_of(int d) {
  CUcontext c = atomic_load_explicit(&devices[d].ctx, memory_order_acquire);
  if (c != NULL) return c;
  c = atomic_load_explicit(&rec_drv.primary[d], memory_order_acquire);
  if (c != NULL) return c;
  c = primary_of(d); /* retaining it twice (two threads at once) is harmless: one primary context */
  atomic_store_explicit(&rec_drv.primary[d], c, memory_order_release);
  return c;
}

/* fs (the free's stream, of device `device`) waits for all work enqueued so far on `other`, a
 * stream that is neither the legacy stream nor fs's, of whatever device. CAPTURE while either
 * captures (kept until the capture ends, as before). The calling thread's context is left as
 * it was. */
static weft_status_t wait_for_stream(int device, weft_stream_t *fs, CUstream other, uintptr_t ptr) {
  pthread_once(&rec_drv_once, rec_drv_resolve);
  if (rec_drv.event_create == NULL || rec_drv.event_record == NULL || rec_drv.event_destroy == NULL ||
      rec_drv.is_capturing == NULL || ctx_get == NULL)
    return fail(WEFT_ERR_NOT_SUPPORTED, "weft_torch: free(0x%llx): the driver lacks event calls",
                (unsigned long long)ptr);
  int a = 0;
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  weft_status_t st = weft_stream_is_capturing(fs, &a);
  if (st != WEFT_OK)
    return fail(st, "weft_torch: free(0x%llx): %s", (unsigned long long)ptr, weft_last_error());
  CUresult r = rec_drv.is_capturing(other, &cs);
  if (r != CUDA_SUCCESS)
    return fail(WEFT_ERR_DRIVER, "weft_torch: free(0x%llx): cuStreamIsCapturing on a recorded stream: %d",
                (unsigned long long)ptr, (int)r);
  if (a || cs != CU_STREAM_CAPTURE_STATUS_NONE)
    return kept_for_capture(ptr);
  CUcontext was = NULL;
  if (ctx_get(&was) != CUDA_SUCCESS) was = NULL;
  st = WEFT_ERR_INVALID_ARGUMENT;
  r = CUDA_ERROR_INVALID_HANDLE;
  for (int k = 0; k < rec_drv.devices && r == CUDA_ERROR_INVALID_HANDLE; k++) {
    int d = k == 0 ? device : k <= device ? k - 1 : k; /* the free's device first */
    CUcontext c = context_of(d);
    CUevent ev;
    if (c == NULL || ctx_set(c) != CUDA_SUCCESS) continue;
    if ((r = rec_drv.event_create(&ev, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS) break;
    r = rec_drv.event_record(ev, other);
    if (r == CUDA_SUCCESS) {
      st = weft_stream_import_event(fs, ev);
      if (st != WEFT_OK) fail(st, "weft_torch: free(0x%llx): waiting for a recorded stream: %s", (unsigned long long)ptr,
                              weft_last_error());
    }
    (void)rec_drv.event_destroy(ev); /* a wait on it stays */
  }
  CUcontext now = NULL;
  if (ctx_get(&now) == CUDA_SUCCESS && now != was) (void)ctx_set(was);
  if (r != CUDA_SUCCESS)
    return fail(r == CUDA_ERROR_INVALID_HANDLE ? WEFT_ERR_INVALID_ARGUMENT : WEFT_ERR_DRIVER,
                "weft_torch: free(0x%llx): a recorded stream: cuEventRecord: %d (no stream of any device?)",
                (unsigned long long)ptr, (int)r);
  return st;
}

/* Before the free of ptr on device `device`'s stream `on` (fs: its weft stream): fs waits for all
 * work enqueued so far on every other stream recorded for ptr (weft_stream_import_stream), as PyTorch's
 * allocator reuses such memory only after it. Not while either stream captures (a wait there on
 * work outside the capture would invalidate it): CAPTURE, and the free is kept until the capture
 * has ended, as PyTorch defers record_stream's events while a capture is underway. The record is
 * dropped once done; on a failure it stays, for the free to be made again (kept_t). */
static weft_status_t declare_recorded_now(weft_runtime_t *rt, int device, uintptr_t ptr, CUstream on,
                                          weft_stream_t *fs);
static inline weft_status_t declare_recorded(weft_runtime_t *rt, int device, uintptr_t ptr, CUstream on,
                                            weft_stream_t *fs) {
  if (atomic_load_explicit(&rec_count[rec_slot(ptr)], memory_order_acquire) == 0) return WEFT_OK; /* nearly every free */
  return declare_recorded_now(rt, device, ptr, on, fs);
}

/* declare_recorded's work, where a stream may be recorded for ptr. */
__attribute__((noinline)) static weft_status_t declare_recorded_now(weft_runtime_t *rt, int device, uintptr_t ptr,
                                                                   CUstream on, weft_stream_t *fs) {
  unsigned b = rec_slot(ptr);
  pthread_mutex_lock(&rec_lock);
  recorded_t *r = rec_bucket[b];
  while (r != NULL && r->ptr != ptr) r = r->next;
  recorded_t copy = r != NULL ? *r : (recorded_t){0};
  pthread_mutex_unlock(&rec_lock);
  if (r == NULL) return WEFT_OK;
  /* While a PyTorch capture is begun on the device (its begin hook ran, its end hook not yet),
   * the waits wait, as PyTorch's allocator defers record_stream's events while captures are
   * underway: a check that neither stream captures, then the record and the wait, would let a
   * capture begun on another thread in between take the wait (an isolation error invalidates
   * it: test_torch_pools' eight threads, "the capture ended with 901"). The free is kept and made
   * once no capture is begun (kept_t). */
  device_t *dv = &devices[device];
  pthread_rwlock_rdlock(&dv->begin);
  if (atomic_load_explicit(&dv->drawing, memory_order_relaxed) != 0) {
    pthread_rwlock_unlock(&dv->begin);
    return kept_for_capture(ptr);
  }
  weft_status_t st = WEFT_OK;
  for (unsigned i = 0; st == WEFT_OK && i < copy.n; i++) {
    if (copy.streams[i] == on) continue; /* the free's own stream is ordered already */
    if (copy.streams[i] != NULL && copy.streams[i] != CU_STREAM_LEGACY) {
      st = wait_for_stream(device, fs, copy.streams[i], ptr);
      continue;
    }
    weft_stream_t *rs = stream_of(rt, device, copy.streams[i]);
    int a = 0, c = 0;
    if (rs == NULL) st = WEFT_ERR_INVALID_ARGUMENT;
    else if ((st = weft_stream_is_capturing(fs, &a)) == WEFT_OK && (st = weft_stream_is_capturing(rs, &c)) == WEFT_OK &&
             (a || c))
      st = kept_for_capture(ptr);
    else if (st == WEFT_OK)
      st = weft_stream_import_stream(fs, copy.streams[i] != NULL ? copy.streams[i] : CU_STREAM_LEGACY);
    if (st != WEFT_OK && st != WEFT_ERR_CAPTURE)
      fail(st, "weft_torch: free(0x%llx): waiting for a recorded stream: %s", (unsigned long long)ptr,
           rs != NULL ? weft_last_error() : last_error);
  }
  pthread_rwlock_unlock(&dv->begin);
  if (st != WEFT_OK) return st; /* kept: made again with the record */
  pthread_mutex_lock(&rec_lock);
  for (recorded_t **at = &rec_bucket[b]; *at != NULL; at = &(*at)->next)
    if (*at == r) {
      *at = r->next;
      atomic_fetch_sub_explicit(&rec_count[b], 1, memory_order_release);
      free(r);
      break;
    }
  pthread_mutex_unlock(&rec_lock);
  return WEFT_OK;
}

/* The accesses of a declared use: blocks found by pointer (unknown pointers skipped). */
static size_t accesses(weft_runtime_t *rt, const uint64_t *reads, size_t nr, const uint64_t *writes, size_t nw,
                       weft_access_t *out) {
  size_t n = 0;
  for (size_t i = 0; i < nr + nw; i++) {
    uint64_t p = i < nr ? reads[i] : writes[i - nr];
    weft_block_t b;
    if (p == 0 || weft_block_find(rt, (CUdeviceptr)p, &b) != WEFT_OK) continue;
    weft_access_kind_t kind = i < nr ? WEFT_READ : WEFT_WRITE;
    size_t j = 0;
    while (j < n && out[j].block.rec != b.rec) j++; /* one access per block: merge the kinds */
    if (j < n) out[j].kind = (weft_access_kind_t)(out[j].kind | kind);
    else out[n++] = (weft_access_t){b, kind};
  }
  return n;
}

static int use(bool begin, int device, CUstream stream, const uint64_t *reads, size_t nr, const uint64_t *writes,
               size_t nw) {
  weft_runtime_t *rt = runtime_of(device);
  if (rt == NULL) return WEFT_ERR_INVALID_ARGUMENT;
  flush_kept(rt, &devices[device]);
  if ((nr != 0 && reads == NULL) || (nw != 0 && writes == NULL) || nr + nw > MAX_USE)
    return fail(WEFT_ERR_INVALID_ARGUMENT, "weft_torch_use: NULL access list or more than %d accesses", MAX_USE);
  weft_stream_t *s = stream_of(rt, device, stream);
  if (s == NULL) return WEFT_ERR_INVALID_ARGUMENT;
  weft_access_t acc[MAX_USE];
  size_t n = accesses(rt, reads, nr, writes, nw, acc);
  weft_status_t st = begin ? weft_use_begin(s, acc, n) : weft_use_end(s, acc, n);
  return st == WEFT_OK ? 0 : fail(st, "weft_torch_use_%s: %s", begin ? "begin" : "end", weft_last_error());
}

int weft_torch_use_begin(int device, CUstream stream, const uint64_t *reads, size_t n_reads, const uint64_t *writes,
                         size_t n_writes) {
  ctx_scope_t sc = ctx_enter(device);
  int r = use(true, device, stream, reads, n_reads, writes, n_writes);
  ctx_leave(sc);
  return r;
}

int weft_torch_use_end(int device, CUstream stream, const uint64_t *reads, size_t n_reads, const uint64_t *writes,
                       size_t n_writes) {
  ctx_scope_t sc = ctx_enter(device);
  int r = use(false, device, stream, reads, n_reads, writes, n_writes);
  ctx_leave(sc);
  return r;
}

int weft_torch_stats(int device, char *buf, size_t len) {
  if (device < 0 || device >= MAX_DEVICES || buf == NULL || len == 0) return -1;
  device_t *d = &devices[device];
  weft_runtime_t *rt = atomic_load_explicit(&d->rt, memory_order_acquire);
  weft_counters_t c;
  if (rt == NULL || weft_runtime_counters(rt, &c) != WEFT_OK) return -1;
  weft_resource_stats_t r;
  weft_resource_stats(weft_runtime_resource(rt), &r);
  weft_options_t o;
  if (weft_runtime_options(rt, &o) != WEFT_OK) return -1;
  uint64_t graph_reserved = 0;
  pthread_mutex_lock(&d->lock);
  unsigned pools = 0; /* graph pools (a PyTorch pool id no capture drew from has none) */
  for (unsigned i = 0; i < d->n_pools; i++)
    if (d->pools[i].pool != NULL) {
      pools++;
      graph_reserved += weft_graph_pool_reserved(d->pools[i].pool);
    }
  pthread_mutex_unlock(&d->lock);
  int n = snprintf(buf, len,
                   "{\"uses\": %" PRIu64 ", \"accesses\": %" PRIu64 ", \"waits_issued\": %" PRIu64
                   ", \"waits_skipped\": %" PRIu64 ", \"events_recorded\": %" PRIu64 ", \"allocs\": %" PRIu64
                   ", \"frees\": %" PRIu64 ", \"live_bytes\": %" PRIu64 ", \"live_peak\": %" PRIu64
                   ", \"reserved_bytes\": %" PRIu64 ", \"reserved_peak\": %" PRIu64 ", \"graph_pools\": %u"
                   ", \"graph_pool_reserved\": %" PRIu64 ", \"adapter_allocs\": %" PRIu64 ", \"adapter_frees\": %" PRIu64
                   ", \"zero_byte_allocs\": %" PRIu64 ", \"alloc_failures\": %" PRIu64 ", \"free_failures\": %" PRIu64
                   ", \"graph_frees_ignored\": %" PRIu64 ", \"frees_kept\": %" PRIu64 ", \"frees_pending\": %u"
                   ", \"streams_recorded\": %" PRIu64 ", \"adopt_streams\": %u, \"pool_chunk_bytes\": %" PRIu64
                   ", \"release_threshold\": %" PRIu64 ", \"cached_blocks\": %" PRIu64 ", \"cached_bytes\": %" PRIu64 "}",
                   c.uses, c.accesses, c.waits_issued, c.waits_skipped, c.events_recorded, c.allocs, c.frees,
                   r.live_bytes - (c.cached_bytes <= r.live_bytes ? c.cached_bytes : r.live_bytes), r.live_peak,
                   r.reserved_bytes, r.reserved_peak, pools, graph_reserved,
                   counted(device, true), counted(device, false), atomic_load(&d->zero_bytes),
                   atomic_load(&d->alloc_failures), atomic_load(&d->free_failures), atomic_load(&d->graph_frees),
                   atomic_load(&d->frees_kept), atomic_load(&d->pending), atomic_load(&rec_calls), o.adopt_streams,
                   o.pool_chunk_bytes, o.release_threshold, c.cached_blocks, c.cached_bytes);
  if (n < 0) return -1;
  return (size_t)n >= len ? (int)len - 1 : n;
}

void weft_torch_empty_cache(void) {
  for (int device = 0; device < MAX_DEVICES; device++) {
    device_t *d = &devices[device];
    weft_runtime_t *rt = atomic_load_explicit(&d->rt, memory_order_acquire);
    if (rt == NULL) continue;
    ctx_scope_t sc = ctx_enter(device);
    flush_kept(rt, d);
    weft_status_t st = weft_runtime_trim(rt); /* the streams' caches, then the pool's idle chunks */
    ctx_leave(sc);
    /* A capture under way keeps what it may see: nothing to report (PyTorch's own empty_cache
     * skips what a capture uses too). */
    if (st != WEFT_OK && st != WEFT_ERR_CAPTURE) {
      fail(st, "weft_torch: empty_cache on device %d: %s", device, weft_last_error());
      if (atomic_fetch_add(&reported, 1) < 10) fprintf(stderr, "%s\n", last_error);
    }
  }
}

int weft_torch_release_graph_pools(int device) {
  if (device < 0 || device >= MAX_DEVICES) return 0;
  device_t *d = &devices[device];
  weft_runtime_t *rt = atomic_load_explicit(&d->rt, memory_order_acquire);
  ctx_scope_t sc = ctx_enter(device);
  if (rt != NULL) flush_kept(rt, d); /* frees kept while captures ran */
  int released = 0;
  /* One pool at a time, with no lock held while weft is asked (it may meet a capture and call
   * on_capture) or the destroy waits for the device. */
  for (;;) {
    weft_graph_pool_t *p = NULL;
    weft_stream_t *s = NULL;
    pthread_mutex_lock(&d->lock);
    for (unsigned i = 0; i < d->n_pools && p == NULL; i++) {
      gpool_t *g = &d->pools[i];
      if ((g->id0 | g->id1) != 0 || g->tried) continue; /* PyTorch's own: released by PyTorch */
      g->tried = true;
      p = g->pool;
      s = g->stream;
    }
    pthread_mutex_unlock(&d->lock);
    if (p == NULL) break;
    /* An ended capture lets go of its pool once weft sees it ended; one still under way keeps
     * it (the destroy says BUSY), also when the stream now takes part in a newer capture. */
    if (s != NULL) refresh_capture(s);
    bool mine = false;
    pthread_mutex_lock(&d->lock);
    for (unsigned i = 0; i < d->n_pools && !mine; i++)
      if (d->pools[i].pool == p) {
        d->pools[i] = d->pools[--d->n_pools];
        mine = true;
      }
    pthread_mutex_unlock(&d->lock);
    if (!mine) continue; /* another thread's release took it */
    if (weft_graph_pool_destroy(p) == WEFT_OK) {
      released++;
      continue;
    }
    pthread_mutex_lock(&d->lock); /* kept (a graph or capture still uses it): tried again next time */
    gpool_t *g = gpool_add(d);
    if (g != NULL) *g = (gpool_t){.pool = p, .stream = s, .tried = true};
    pthread_mutex_unlock(&d->lock);
  }
  pthread_mutex_lock(&d->lock);
  for (unsigned i = 0; i < d->n_pools; i++) d->pools[i].tried = false;
  pthread_mutex_unlock(&d->lock);
  ctx_leave(sc);
  return released;
}
