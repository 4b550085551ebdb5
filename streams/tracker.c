/* The access tracker: the stream pool's life cycle, uses, points, ordering and host knowledge
 * (tracker.h has the model; clock.c the record and wait everything here is built from).
 *
 * Everything runs under tr->lock except the blocking host synchronisations, which copy what they
 * need under the lock, wait without it, and merge the result back under it. */
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "lib/core/debug.h"
#include "lib/core/error.h"
#include "lib/core/meta.h"
#include "streams/clock.h"

static inline void lock(weft__tracker_t *tr) { weft__lock(tr->lock); }
static inline void unlock(weft__tracker_t *tr) { weft__unlock(tr->lock); }
static void wait_busy(weft__tracker_t *tr, weft__lanes_t lanes);
/* Waits, the lock released meanwhile, until no lane of `lanes` in the live domain is busy (the
 * common case, none busy, inline). */
static inline void wait_idle(weft__tracker_t *tr, weft__lanes_t lanes) {
  if ((weft__lanes_load(&tr->live->busy) & lanes) != 0) wait_busy(tr, lanes);
}
/* Takes the lock once none of the live lanes of s and the point's stream (when it names one) is
 * busy (tracker.h, "Busy lanes"): for what records on them, enqueues on s, or learns of them. */
static void lock_idle(weft_stream_t *s, const weft__point_t *p) {
  lock(s->tr);
  wait_idle(s->tr, weft__lane_bit(s->lane) | (p != NULL && p->stream < WEFT__MAX_LANES ? weft__lane_bit(p->stream) : 0));
}

/* ---- life cycle -------------------------------------------------------------------------------- */

/* The context the calling thread last bound, so that binding is cheap when nothing changed. */
static _Thread_local CUcontext tls_bound;

weft_status_t weft__tracker_bind(weft__tracker_t *tr) {
  if (tls_bound == tr->ctx) {
    CUcontext cur = NULL;
    if (tr->drv->cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == tr->ctx) return WEFT_OK;
  }
  CUresult r = tr->drv->cuCtxSetCurrent(tr->ctx);
  if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuCtxSetCurrent");
  tls_bound = tr->ctx;
  return WEFT_OK;
}

/* Clears everything but the embedded streams' identities (tr, runtime, index): a handle of a
 * released runtime is then recognised as stale. */
static void owner_unref(struct weft__owner *o);
static struct weft__owner *owner_swap(weft_stream_t *s, struct weft__owner *o);

static void reset(weft__tracker_t *tr) {
  for (unsigned i = 0; i < WEFT__MAX_STREAMS; i++) owner_unref(owner_swap(&tr->streams[i], NULL));
  weft_stream_t keep[WEFT__MAX_STREAMS];
  memcpy(keep, tr->streams, sizeof keep);
  memset(tr, 0, sizeof *tr);
  for (unsigned i = 0; i < WEFT__MAX_STREAMS; i++) {
    tr->streams[i].tr = keep[i].tr;
    tr->streams[i].runtime = keep[i].runtime;
    tr->streams[i].index = keep[i].index;
  }
}

/* Destroys the events of tr's lane i in the live domain (lock held); the first failure. */
static weft_status_t lane_release(weft__tracker_t *tr, unsigned i) {
  return weft__lane_free(tr, tr->live, &tr->live->lane[tr->base + i]);
}

/* Creation unwinds in reverse order on any failure (libuv's ladder). */
weft_status_t weft__tracker_init(weft__tracker_t *tr, const weft__driver_t *drv, int ordinal, unsigned n,
                                 unsigned n_high, unsigned n_adopt, unsigned ring_size, void *runtime) {
  WEFT_ASSERT(n >= 1 && n + n_adopt <= WEFT__MAX_STREAMS && n_high <= n);
  WEFT_ASSERT(ring_size >= 2 && (ring_size & (ring_size - 1)) == 0);
  reset(tr);
  tr->drv = drv;
  tr->ordinal = ordinal;
  tr->n = n + n_adopt;
  tr->n_pool = n;
  tr->n_high = n_high;
  tr->ring_size = ring_size;
  tr->spare_events = WEFT__VEC_INIT(CUevent);
  weft_status_t st;
  CUresult r;
  unsigned made = 0;
  tr->lock = &weft__clock_lock;
  tr->unheld = (weft__cond_t)WEFT__COND_INIT;
  if ((r = drv->cuDeviceGet(&tr->device, ordinal)) != CUDA_SUCCESS) {
    weft__driver_fail(r, "cuDeviceGet");
    st = weft__error(WEFT_ERR_WRONG_DEVICE, "weft: device %d does not exist (%s)", ordinal, weft_driver_error_name(r));
    goto fail_reset;
  }
  if ((r = drv->cuDevicePrimaryCtxRetain(&tr->ctx, tr->device)) != CUDA_SUCCESS) {
    st = weft__driver_fail(r, "cuDevicePrimaryCtxRetain");
    goto fail_reset;
  }
  weft__driver_gate_context(tr->ctx, ordinal); /* the gate is per device (lib/core/gate.h) */
  if ((st = weft__tracker_bind(tr)) != WEFT_OK) goto fail_ctx;
  int least = 0, greatest = 0, ops64 = 0;
  if ((r = drv->cuCtxGetStreamPriorityRange(&least, &greatest)) != CUDA_SUCCESS) {
    st = weft__driver_fail(r, "cuCtxGetStreamPriorityRange");
    goto fail_ctx;
  }
  if (drv->cuDeviceGetAttribute(&ops64, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, tr->device) == CUDA_SUCCESS)
    tr->mem_ops64 = ops64 != 0;
  lock(tr);
  st = weft__clock_lanes_take(tr, tr->n);
  unlock(tr);
  if (st != WEFT_OK) goto fail_ctx;
  for (unsigned i = n; i < tr->n; i++) {
    tr->streams[i].tr = tr;
    tr->streams[i].runtime = runtime;
    tr->streams[i].index = i;
    tr->streams[i].lane = tr->base + i;
  }
  for (; made < n; made++) {
    weft_stream_t *s = &tr->streams[made];
    bool high = made >= n - n_high;
    s->tr = tr;
    s->runtime = runtime;
    s->index = made;
    s->lane = tr->base + made;
    s->high = high;
    s->priority = high ? greatest : least;
    if ((r = drv->cuStreamCreateWithPriority(&s->raw, CU_STREAM_NON_BLOCKING, s->priority)) != CUDA_SUCCESS) {
      s->raw = NULL;
      st = weft__driver_fail(r, "cuStreamCreateWithPriority");
      goto fail_streams;
    }
    /* Live rings up front: a use never fails for want of an event. Under the lock: the lanes are
     * the process's clock domain's, which another runtime's creation may be growing now. */
    lock(tr);
    st = weft__lane_init(tr, tr->live, &tr->live->lane[s->lane]);
    unlock(tr);
    if (st != WEFT_OK) {
      drv->cuStreamDestroy(s->raw);
      s->raw = NULL;
      goto fail_streams;
    }
  }
  return WEFT_OK;

fail_streams:
  while (made-- > 0) {
    drv->cuStreamDestroy(tr->streams[made].raw);
    tr->streams[made].raw = NULL;
  }
  lock(tr);
  for (unsigned i = 0; i < tr->n; i++) (void)lane_release(tr, i); /* st says what failed first */
  weft__clock_lanes_give(tr);
  unlock(tr);
fail_ctx:
  drv->cuDevicePrimaryCtxRelease(tr->device);
fail_reset:
  reset(tr);
  return st;
}

static _Atomic uint64_t g_thread_serials;
static _Thread_local uint64_t tls_thread_serial;

uint64_t weft__tracker_thread_serial(void) {
  if (tls_thread_serial == 0) tls_thread_serial = atomic_fetch_add_explicit(&g_thread_serials, 1, memory_order_relaxed) + 1;
  return tls_thread_serial;
}

#define OWNER_SLOTS 64 /* a thread holds at most one slot per runtime, one runtime per device */

/* A thread that adopted a per-thread stream: whether it has ended. Only its owner can ask the
 * driver about a per-thread stream, so a capture weft knows on it is dropped by other threads
 * once its owner has ended, and its slot may be taken back (weft__tracker_reclaim). Shared by the
 * thread (until it ends) and the slots it owns (until taken back or their runtime goes). */
struct weft__owner {
  _Atomic bool ended;
  _Atomic unsigned refs;
  /* The slots it owns (its per-thread stream in each runtime), for owner_exit; guarded by
   * g_owner_lock. Streams are embedded in their runtimes, never freed. */
  unsigned n_held;
  weft_stream_t *held[OWNER_SLOTS];
};

static _Thread_local struct weft__owner *tls_owner;
static pthread_key_t g_owner_key;
static pthread_once_t g_owner_once = PTHREAD_ONCE_INIT;
static bool g_owner_keyed;

static void owner_unref(struct weft__owner *o) {
  if (o != NULL && atomic_fetch_sub_explicit(&o->refs, 1, memory_order_acq_rel) == 1) weft__meta_free(o);
}

static void owner_ended(void *o) {
  atomic_store_explicit(&((struct weft__owner *)o)->ended, true, memory_order_release);
  tls_owner = NULL; /* (runs on the ending thread: a later destructor's adoption gets a new one) */
  owner_unref(o);
}

static void owner_key_create(void) { g_owner_keyed = pthread_key_create(&g_owner_key, owner_ended) == 0; }

/* Guards every stream's owner_of against its swap (a slot taken back, a runtime released): a
 * leaf lock, taken inside the tracker lock or a communicator's, never around another. A record
 * is read only under it and freed only once no stream holds it. */
static pthread_mutex_t g_owner_lock = PTHREAD_MUTEX_INITIALIZER;

/* The C library's registration of a thread-exit handler (C++'s thread_local destructors use it):
 * glibc's, a strong reference (a static link keeps it); elsewhere weak, and where it is missing,
 * no handler (weft_stream_adopt's doc says to synchronise before the thread ends). */
#ifdef __GLIBC__
extern int __cxa_thread_atexit_impl(void (*fn)(void *), void *arg, void *dso);
#define HAVE_THREAD_ATEXIT() true
#else
extern int __cxa_thread_atexit_impl(void (*fn)(void *), void *arg, void *dso) __attribute__((weak));
#define HAVE_THREAD_ATEXIT() (__cxa_thread_atexit_impl != NULL)
#endif
extern void *__dso_handle;

/* The thread-exit handler of a thread that adopted its per-thread stream: waits until weft's own
 * work on that stream (of each runtime where it still holds a slot) is complete, before the
 * driver ends the thread's state. On the GPU, that teardown of a per-thread stream with work
 * still queued on memory of a stream-ordered pool allocated in its order (weft's pool grows from
 * one, on the allocating stream) spins for ever: the thread never ends (measured,
 * tools/diag_per_thread_exit.c; conformance "per-thread stream at a thread's end"). Handlers of
 * __cxa_thread_atexit_impl run before the driver's teardown; a pthread key's destructor
 * (owner_ended) runs after it, too late. Only weft's work is waited for, through the newest event
 * of the stream's lane (each point of a per-thread stream is recorded at once), not the stream:
 * work other code enqueued after it, say a wait for something the joining thread does after the
 * join, is not waited for. RELAXED, so that another thread's GLOBAL capture stays valid; a
 * stream in a capture weft knows is left alone; the runtime's last release waits for the wait
 * (holds). Not on the process's main thread: exit() does not tear its per-thread streams down
 * (measured: it ends with pool work queued), and waiting there could hold up an exit. */
static void owner_exit(void *arg) {
  struct weft__owner *o = arg;
  if ((pid_t)syscall(SYS_gettid) == getpid()) return;
  weft_stream_t *held[OWNER_SLOTS];
  unsigned n = 0;
  pthread_mutex_lock(&g_owner_lock);
  for (unsigned i = 0; i < o->n_held; i++) held[n++] = o->held[i];
  pthread_mutex_unlock(&g_owner_lock);
  for (unsigned i = 0; i < n; i++) {
    weft_stream_t *s = held[i];
    weft__tracker_t *tr = s->tr;
    CUevent ev = NULL;
    weft__lock(&weft__clock_lock); /* every tracker's lock, live or released */
    pthread_mutex_lock(&g_owner_lock);
    bool mine = s->owner_of == o;
    pthread_mutex_unlock(&g_owner_lock);
    if (mine && !tr->ending && tr->live != NULL && s->capture == NULL) {
      if (weft__clock_newest_event(tr->live, s->lane, &ev) && ev != NULL) s->holds++;
    }
    weft__unlock(&weft__clock_lock);
    if (ev == NULL) continue;
    const weft__driver_t *drv = tr->drv;
    if (weft__tracker_bind(tr) == WEFT_OK) /* (its context lives while the hold does) */
      WEFT__RELAXED(drv, (void)drv->cuEventSynchronize(ev)); /* (nothing to report to at a thread's end) */
    weft__tracker_unhold(s);
  }
}

/* The calling thread's record, a reference taken for a slot; NULL without memory (or a thread
 * key): the slot then counts its owner alive for good (conservative). */
static struct weft__owner *owner_self(void) {
  if (tls_owner == NULL) {
    pthread_once(&g_owner_once, owner_key_create);
    struct weft__owner *o = g_owner_keyed ? weft__meta_calloc(1, sizeof *o) : NULL;
    if (o == NULL) return NULL;
    atomic_init(&o->refs, 1); /* the thread's */
    if (pthread_setspecific(g_owner_key, o) != 0) {
      weft__meta_free(o);
      return NULL;
    }
    /* Runs before owner_ended (thread-exit handlers before key destructors), while o lives. */
    if (HAVE_THREAD_ATEXIT()) (void)__cxa_thread_atexit_impl(owner_exit, o, &__dso_handle);
    tls_owner = o;
  }
  atomic_fetch_add_explicit(&tls_owner->refs, 1, memory_order_relaxed);
  return tls_owner;
}


/* Adds s to o's slots, or takes it out (g_owner_lock held). */
static void owner_hold(struct weft__owner *o, weft_stream_t *s, bool add) {
  if (add) {
    if (o->n_held < OWNER_SLOTS) o->held[o->n_held++] = s;
    return;
  }
  for (unsigned i = 0; i < o->n_held; i++)
    if (o->held[i] == s) {
      o->held[i] = o->held[--o->n_held];
      return;
    }
}

/* Makes o s's owner record and returns the one it had (whose reference the caller drops). */
static struct weft__owner *owner_swap(weft_stream_t *s, struct weft__owner *o) {
  pthread_mutex_lock(&g_owner_lock);
  struct weft__owner *was = s->owner_of;
  s->owner_of = o;
  if (was != NULL) owner_hold(was, s, false);
  if (o != NULL) owner_hold(o, s, true);
  pthread_mutex_unlock(&g_owner_lock);
  return was;
}

bool weft__tracker_owner_ended(weft_stream_t *s) {
  if (!s->per_thread) return false;
  pthread_mutex_lock(&g_owner_lock);
  bool ended = s->owner_of != NULL && atomic_load_explicit(&s->owner_of->ended, memory_order_acquire);
  pthread_mutex_unlock(&g_owner_lock);
  return ended;
}

weft_status_t weft__tracker_adopt(weft__tracker_t *tr, CUstream raw, weft_stream_t **out) {
  if (raw == CU_STREAM_LEGACY) raw = NULL; /* two names of one stream */
  bool per_thread = raw == CU_STREAM_PER_THREAD;
  uint64_t self = per_thread ? weft__tracker_thread_serial() : 0;
  for (unsigned i = 0; i < tr->n_pool; i++)
    if (raw != NULL && tr->streams[i].raw == raw)
      return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_stream_adopt: the stream is weft's pool stream %u (use it as it is)", i);
  /* The thread's record first, outside the lock: its first making registers a thread-exit
   * handler (the C library's locks and allocator). */
  struct weft__owner *me = per_thread ? owner_self() : NULL;
  weft_status_t st = WEFT_OK;
  lock(tr);
  unsigned n = atomic_load_explicit(&tr->n_adopted, memory_order_relaxed), i = tr->n_pool;
  for (; i < tr->n_pool + n; i++) {
    weft_stream_t *s = &tr->streams[i];
    if (s->raw == raw && (!per_thread || atomic_load_explicit(&s->owner, memory_order_relaxed) == self)) break;
  }
  if (i == tr->n_pool + n) {
    if (i == tr->n) {
      st = weft__error(WEFT_ERR_BUSY,
                       "weft_stream_adopt: all %u adoption slots are taken (options.adopt_streams; a thread that "
                       "adopted CU_STREAM_PER_THREAD keeps its slot while it lives, a stream of another library until "
                       "the runtime is released)",
                       tr->n - tr->n_pool);
    } else if ((st = weft__lane_init(tr, tr->live, &tr->live->lane[tr->base + i])) == WEFT_OK) {
      weft_stream_t *s = &tr->streams[i];
      int prio = 0;
      s->raw = raw;
      s->adopted = true;
      s->per_thread = per_thread;
      atomic_store_explicit(&s->owner, self, memory_order_relaxed);
      owner_unref(owner_swap(s, me)); /* (none before: a new slot) */
      me = NULL;
      s->high = false;
      s->priority = tr->drv->cuStreamGetPriority(raw, &prio) == CUDA_SUCCESS ? prio : 0;
      atomic_store_explicit(&s->exposed, true, memory_order_relaxed); /* outside code owns it */
      /* The slot's point was published when the lane was claimed; a per-thread stream has none
       * (its lock-free point had stayed tick 0: the pool stamped its chunks and frees complete). */
      weft__clock_publish(tr->live, s->lane);
      atomic_store_explicit(&tr->n_adopted, n + 1, memory_order_release);
    }
  }
  unlock(tr);
  owner_unref(me); /* not taken by a new slot */
  if (st == WEFT_OK) *out = &tr->streams[i];
  return st;
}

weft_status_t weft__tracker_reclaim(weft__tracker_t *tr, weft_stream_t **out) {
  uint64_t self = weft__tracker_thread_serial();
  struct weft__owner *me = owner_self();
  weft__domain_t *d = tr->live;
  weft_stream_t *s = NULL;
  uint64_t was = 0;
  struct weft__owner *was_of = NULL;
  CUevent ev = NULL;
  lock(tr);
  unsigned n = atomic_load_explicit(&tr->n_adopted, memory_order_relaxed);
  for (unsigned i = tr->n_pool; i < tr->n_pool + n && s == NULL; i++) {
    weft_stream_t *c = &tr->streams[i];
    const weft__lane_t *l = &d->lane[c->lane];
    if (!c->per_thread || c->capture != NULL || c->holds != 0 || weft__lanes_atomic_has(&d->busy, c->lane) ||
        l->recorded != l->tick || !weft__tracker_owner_ended(c))
      continue;
    if (!weft__clock_newest_event(d, c->lane, &ev)) continue; /* no event covers its work */
    s = c;
    /* The caller's from now on: nobody else may use it, or choose it here (its owner record is
     * the caller's, not an ended one). */
    was = atomic_load_explicit(&c->owner, memory_order_relaxed);
    was_of = owner_swap(c, me);
    atomic_store_explicit(&c->owner, self, memory_order_relaxed);
  }
  unlock(tr);
  if (s == NULL) {
    owner_unref(me);
    return WEFT_ERR_BUSY;
  }
  /* Its newest event covers all its work (nothing is pending on it): once it completes, the host
   * knows every tick of the lane (no wait where it knows so already). */
  CUresult r = CUDA_SUCCESS;
  if (ev != NULL) WEFT__RELAXED(tr->drv, r = tr->drv->cuEventSynchronize(ev));
  lock(tr);
  if (r != CUDA_SUCCESS) {
    atomic_store_explicit(&s->owner, was, memory_order_relaxed); /* as it was: an ended owner's */
    owner_unref(owner_swap(s, was_of));
  } else {
    owner_unref(was_of);
    atomic_store_explicit(&s->exact, false, memory_order_relaxed); /* weft__clock_renew clears the lane's */
    weft__clock_renew(d, s->lane);
    s->use_open = false; /* a use its owner opened and never closed */
    s->use_print = 0;
  }
  unlock(tr);
  if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuEventSynchronize (taking back an ended thread's stream)");
  *out = s;
  return WEFT_OK;
}

weft_status_t weft__tracker_destroy(weft__tracker_t *tr) {
  if (tr->live == NULL) return WEFT_OK;
  weft_status_t first = weft__tracker_bind(tr);
  /* No new host wait from here on (an ending thread's, owner_exit), and none still going on
   * the events about to be destroyed. */
  lock(tr);
  tr->ending = true;
  for (unsigned i = 0; i < tr->n; i++)
    while (tr->streams[i].holds != 0) weft__cond_wait(&tr->unheld, tr->lock);
  unlock(tr);
  /* Adopted streams are someone else's: their work is waited for through weft's own events (an
   * adopted CU_STREAM_PER_THREAD could not be named from this thread anyway). */
  for (unsigned i = 0; i < tr->n; i++) {
    if (!weft__tracker_lane_used(tr, i)) continue;
    CUresult r;
    if (!tr->streams[i].adopted) {
      WEFT__RELAXED(tr->drv, r = tr->drv->cuStreamSynchronize(tr->streams[i].raw));
      if (r != CUDA_SUCCESS && first == WEFT_OK) first = weft__driver_fail(r, "cuStreamSynchronize (release)");
      continue;
    }
    const weft__lane_t *l = &tr->live->lane[tr->streams[i].lane];
    if (tr->streams[i].capture != NULL) continue;
    /* A pending tick (lazy records) is recorded first, so that its event covers the work. */
    lock(tr);
    weft_status_t fl = weft__clock_flush(tr, tr->live, &tr->streams[i]);
    unlock(tr);
    if (fl != WEFT_OK && first == WEFT_OK) first = fl;
    if (l->recorded == 0 || l->ring == NULL) continue;
    WEFT__RELAXED(tr->drv, r = tr->drv->cuEventSynchronize(l->ring[l->recorded & (l->ring_size - 1)]));
    if (r != CUDA_SUCCESS && first == WEFT_OK) first = weft__driver_fail(r, "cuEventSynchronize (release)");
  }
  /* Device-timestamp spans are read while the context is still here. */
  for (unsigned i = 0; i < tr->n; i++) {
    weft__trace_device_drop(tr->streams[i].span);
    tr->streams[i].span = NULL;
  }
  weft__trace_device_flush(tr->ordinal);
  lock(tr);
  for (unsigned i = 0; i < tr->n; i++) {
    weft_status_t st = lane_release(tr, i);
    if (first == WEFT_OK) first = st;
  }
  weft__clock_lanes_give(tr);
  unlock(tr);
  for (size_t i = 0; i < tr->spare_events.len; i++) {
    CUresult r = tr->drv->cuEventDestroy(WEFT__VEC_AT(&tr->spare_events, CUevent, i));
    if (r != CUDA_SUCCESS && first == WEFT_OK) first = weft__driver_fail(r, "cuEventDestroy (release)");
  }
  weft__vec_free(&tr->spare_events);
  for (unsigned i = 0; i < tr->n_pool; i++) {
    CUresult r = tr->drv->cuStreamDestroy(tr->streams[i].raw);
    if (r != CUDA_SUCCESS && first == WEFT_OK) first = weft__driver_fail(r, "cuStreamDestroy (release)");
  }
  CUresult r = tr->drv->cuDevicePrimaryCtxRelease(tr->device);
  if (r != CUDA_SUCCESS && first == WEFT_OK) first = weft__driver_fail(r, "cuDevicePrimaryCtxRelease (release)");
  reset(tr);
  return first;
}

/* ---- uses ---------------------------------------------------------------------------------------- */

void weft__access_init(weft__access_state_t *st, uint64_t *reads, unsigned cap) {
  st->write = (weft__point_t){0, 0};
  st->reader_mask = 0;
  st->reads = reads;
  st->reads_cap = cap;
  st->graph = NULL;
  st->last_use = 0;
}

/* A block allocated inside a capture (or a graph builder) has memory only in that graph: a use
 * on a stream outside it would run on memory that does not exist yet. */
static weft_status_t check_graph_memory(const weft__capture_t *c, const weft_stream_t *s, const weft__use_t *uses,
                                        size_t n) {
  for (size_t i = 0; i < n; i++)
    if (uses[i].state->graph != NULL && uses[i].state->graph != c)
      return weft__error(WEFT_ERR_CAPTURE,
                         "weft: accesses[%zu] is a block allocated inside a capture or a graph builder; stream %u "
                         "takes no part in it (join the stream to that capture with weft_capture_join)",
                         i, s->index);
  return WEFT_OK;
}

/* The histories the uses of s act on: the live ones, or inside a capture their capture-local
 * records (created on first touch; that also builds the capture's access summary). */
static weft_status_t translate(weft__capture_t *c, const weft__use_t *uses, size_t n, weft__use_t *out, bool note_kinds) {
  /* Room first: out[] points into the capture's table, which must not move during the loop. */
  if (!weft__vec_reserve(&c->blocks, n) || !weft__map_reserve(&c->index, n))
    return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: no host memory for capture records");
  for (size_t i = 0; i < n; i++) {
    weft__capture_block_t *b = weft__capture_block(c, uses[i].state, false);
    if (b == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: no host memory for a capture record");
    if (b->gen == 0) b->gen = uses[i].gen; /* the block the capture first saw */
    if (note_kinds) b->kind |= uses[i].kind;
    out[i] = (weft__use_t){&b->local, uses[i].kind, 0};
  }
  return WEFT_OK;
}

/* What a use on s must wait for: the lanes of `mask`, and for each t of them the newest tick of
 * t it conflicts with (weft__rule_*) that s does not imply yet. tick[t] is defined for the lanes
 * of mask only (set when t joins it), so nobody clears it: a use touches a few lanes of a domain
 * of many (no work or cache lines per lane of the domain). `newest`: the lanes where that tick's
 * newest use (weft__clock_newest_use) is one the use conflicts with (known from the blocks'
 * last_use), so that the tick's event, a joined deferred tick's too, sits exactly at the point
 * needed (weft__clock_needed). */
typedef struct needs {
  weft__lanes_t mask, newest;
  uint64_t tick[WEFT__MAX_LANES];
} needs_t;

/* One conflicting point (t, tick) of a use on s, with block st's write there (`write`) or a read:
 * a need unless s already implies it. */
/* (Out of line: one copy serves the write and the reads, shorter code than two inline.) */
static __attribute__((noinline)) void consider(weft__tracker_t *tr, const weft__domain_t *d, unsigned s, unsigned t,
                                               uint64_t tick, needs_t *nd, const weft__access_state_t *st,
                                               bool write) {
  if (!weft__clock_implied(d, s, t, tick)) {
    weft__lanes_t bit = weft__lane_bit(t);
    /* The block's newest (stamped) use: the write's if it wrote, one of the reads' if it read. */
    bool newest = st->last_use != 0 && (st->last_use & 1) == write &&
                  st->last_use >> 1 == weft__clock_newest_use(d, t, tick);
    if ((nd->mask & bit) == 0 || tick > nd->tick[t]) {
      nd->tick[t] = tick;
      nd->newest = newest ? nd->newest | bit : nd->newest & ~bit;
    } else if (tick == nd->tick[t] && newest) {
      nd->newest |= bit;
    }
    nd->mask |= bit;
  } else {
    tr->counters.waits_skipped++;
    if (WEFT__ROW(d, s)[t] < tick) tr->counters.waits_host_known++;
  }
}

/* The needs of a use on s (needs_t); returns nd->mask. */
static weft__lanes_t collect_needs(weft__tracker_t *tr, const weft__domain_t *d, unsigned s, const weft__use_t *uses,
                                   size_t n, needs_t *nd) {
  nd->mask = nd->newest = 0;
  for (size_t i = 0; i < n; i++) {
    const weft__access_state_t *st = uses[i].state;
    if (st->write.tick != 0 && st->write.stream != s) consider(tr, d, s, st->write.stream, st->write.tick, nd, st, true);
    if (weft__rule_follows_reads(uses[i].kind))
      for (weft__lanes_t m = st->reader_mask; m != 0; m &= m - 1) {
        unsigned t = weft__lanes_first(m);
        if (t != s) consider(tr, d, s, t, st->reads[t], nd, st, false);
      }
  }
  return nd->mask;
}

/* issue_waits' wait for nd's need on lane t, whose event is in ring slot `slot`. */
static inline weft_status_t wait_need(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *s, const needs_t *nd,
                                      unsigned t, unsigned slot) {
  /* Only a wait issued can be late: a need another kept one implies costs nothing more. */
  weft__clock_needed(tr, d, d->stream[t], nd->tick[t], weft__lanes_has(nd->newest, t));
  return weft__clock_wait_at(tr, d, s, d->stream[t], nd->tick[t], slot);
}

/* Issues the waits for `nd`, dropping every need that another kept one implies: what is
 * left is the set of maximal conflicting points, one wait each.
 *
 * Pruning may use only what reaching need[u] itself implies: the snapshot of exactly that tick's
 * event, while it is in the ring. When the tick was evicted, the wait goes to a newer event that
 * implies more; but if u is then pruned in favour of w, which knows u only at need[u], whatever
 * only the newer event implied is lost. So an evicted need prunes nothing (it still waits on the
 * stand-in, which is conservative). Without evictions this is the transitive reduction. */
static weft_status_t issue_waits(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *s, const needs_t *nd) {
  weft__lanes_t mask = nd->mask;
  const uint64_t *need = nd->tick;
  if (mask == 0 || tr->no_waits) return WEFT_OK;
  if ((mask & (mask - 1)) == 0) { /* one need (the common edge): no slots to keep, nothing to prune */
    unsigned t = weft__lanes_first(mask), one;
    weft_status_t st = weft__clock_slot(tr, d, d->stream[t], need[t], &one);
    return st == WEFT_OK ? wait_need(tr, d, s, nd, t, one) : st;
  }
  unsigned slot[WEFT__MAX_LANES];
  for (weft__lanes_t m = mask; m != 0; m &= m - 1) {
    unsigned t = weft__lanes_first(m);
    weft_status_t st = weft__clock_slot(tr, d, d->stream[t], need[t], &slot[t]);
    if (st != WEFT_OK) return st;
  }
  const uint64_t *implies[WEFT__MAX_LANES];
  for (weft__lanes_t m = mask; m != 0; m &= m - 1) {
    unsigned t = weft__lanes_first(m);
    const weft__lane_t *l = &d->lane[t];
    implies[t] = l->ring_tick[slot[t]] == need[t] ? &l->ring_clock[(size_t)slot[t] * d->stride] : NULL;
  }
  weft__lanes_t kept = mask;
  for (weft__lanes_t m = mask; m != 0; m &= m - 1) {
    unsigned t = weft__lanes_first(m);
    for (weft__lanes_t o = kept & ~weft__lane_bit(t); o != 0; o &= o - 1) {
      unsigned u = weft__lanes_first(o);
      if (implies[u] != NULL && implies[u][t] >= need[t]) {
        kept &= ~weft__lane_bit(t);
        tr->counters.waits_skipped++;
        break;
      }
    }
  }
  for (weft__lanes_t m = kept; m != 0; m &= m - 1) {
    unsigned t = weft__lanes_first(m);
    weft_status_t st = wait_need(tr, d, s, nd, t, slot[t]);
    if (st != WEFT_OK) return st;
  }
  return WEFT_OK;
}

/* What a use on s must wait for (*nd; returns nd->mask). When one of those lanes is busy
 * (tracker.h), *busy gets them and the counters are as they were (the caller waits until they
 * are idle, then looks again). */
static inline __attribute__((always_inline)) weft__lanes_t needs_locked(weft__tracker_t *tr, const weft__domain_t *d,
                                                                        const weft_stream_t *s,
                                                                        const weft__use_t *uses, size_t n,
                                                                        needs_t *nd, weft__lanes_t *busy) {
  uint64_t skipped = tr->counters.waits_skipped, host = tr->counters.waits_host_known;
  weft__lanes_t mask = collect_needs(tr, d, weft__at(d, s), uses, n, nd);
  /* Only a need of a busy lane's pending tick waits for the lane (its event is not recorded, and
   * may never be); an older tick's event serves as it is. */
  *busy = 0;
  if (d == tr->live)
    for (weft__lanes_t m = mask & weft__lanes_load(&d->busy); m != 0; m &= m - 1) {
      unsigned t = weft__lanes_first(m);
      if (nd->tick[t] > d->lane[t].recorded) *busy |= weft__lane_bit(t);
    }
  if (*busy != 0) {
    tr->counters.waits_skipped = skipped; /* counted again when it looks again */
    tr->counters.waits_host_known = host;
  }
  return mask;
}

/* Whether issue_locked makes a driver call for `nd` on s (lock held, live domain): only for a
 * need, or to record a tick left unrecorded on a lane that does not defer it (weft__clock_flush).
 * Else neither it nor s's context is needed. */
static inline __attribute__((always_inline)) bool issue_calls_driver(const weft__domain_t *d, const weft_stream_t *s,
                                                                     const needs_t *nd) {
  const weft__lane_t *l = &d->lane[s->lane];
  return nd->mask != 0 || (!l->deferred && l->recorded != l->tick);
}

/* Issues the waits needs_locked found: s's pending tick first, so that its event sits at its
 * point rather than after these waits (a deferred one, lazy records, is joined instead). */
static inline __attribute__((always_inline)) weft_status_t issue_locked(weft__tracker_t *tr, weft__domain_t *d,
                                                                        weft_stream_t *s, const needs_t *nd) {
  weft_status_t st = d->lane[weft__at(d, s)].deferred ? WEFT_OK : weft__clock_flush(tr, d, s);
  return st == WEFT_OK && nd->mask != 0 ? issue_waits(tr, d, s, nd) : st; /* (most uses need no wait) */
}

/* Issues the waits of a use on s, unless one of the lanes it must wait for is busy: then *busy
 * gets them and nothing changed. */
static weft_status_t begin_locked(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *s, const weft__use_t *uses,
                                  size_t n, weft__lanes_t *busy) {
  needs_t nd;
  (void)needs_locked(tr, d, s, uses, n, &nd, busy);
  return *busy != 0 ? WEFT_OK : issue_locked(tr, d, s, &nd);
}

/* wait_idle's wait, where a lane of `lanes` is busy. */
static void wait_busy(weft__tracker_t *tr, weft__lanes_t lanes) {
  tr->counters.busy_waits++;
  while ((weft__lanes_load(&tr->live->busy) & lanes) != 0) weft__clock_idle_wait(tr, lanes);
}

/* Whether a use of s in the live domain leaves its tick pending (lazy records, tracker.h): not
 * on an eager lane, and not on an exposed stream (weft__tracker_expose): code outside weft may
 * begin a capture on it at any moment, and a pending event recorded then would land in that
 * capture. */
static bool live_defers(const weft__tracker_t *tr, const weft__domain_t *d, const weft_stream_t *s) {
  return tr->lazy && !d->lane[s->lane].eager && !atomic_load_explicit(&s->exposed, memory_order_relaxed);
}

/* A deferred use (lazy records) numbers itself in its lane (last_use) and stamps the blocks it
 * touches (weft__access_state_t.last_use), so that a consumer can tell whether it needs the
 * newest use of a joined tick. A use that records its own event needs neither: its tick covers
 * it alone, so no wait for it is ever late (a stale stamp of an older deferred use still says
 * truly which use touched the block last among those that stamp). Returns the stamp without its
 * kind bit, 0 for a use that does not stamp. */
static uint64_t stamp_of(weft__domain_t *d, unsigned at, bool defer) {
  return defer ? (d->lane[at].last_use = ++d->use_seq) << 1 : 0;
}

/* One access of a use of lane `at` at tick k, in the block's history (the conflict rule), with
 * the use's stamp (0: none). */
static void note_access(weft__access_state_t *a, unsigned at, uint64_t k, unsigned kind, uint64_t stamp) {
  if (stamp != 0) a->last_use = stamp | weft__rule_starts_history(kind);
  if (weft__rule_starts_history(kind)) {
    a->write = (weft__point_t){at, k};
    a->reader_mask = 0;
  } else {
    WEFT_ASSERT_INTERNAL(at < a->reads_cap); /* grown before the use began (grow_reads) */
    a->reads[at] = k;
    a->reader_mask |= weft__lane_bit(at);
  }
}

typedef weft__lane_was_t lane_was_t;
typedef weft__undo_t undo_t;

/* Records a busy use's accesses at the pending tick of s that its work will have (tracker.h,
 * "Busy lanes"), saving in undo[0..n) and *was what putting them back needs. Returns whether
 * the tick stays deferred after the work (lazy records); lock held. */
static inline __attribute__((always_inline)) bool reserve_use(weft__tracker_t *tr, weft__domain_t *d,
                                                              weft_stream_t *s, const weft__use_t *uses, size_t n,
                                                              undo_t *undo, lane_was_t *was) {
  unsigned at = s->lane;
  weft__lane_t *l = &d->lane[at];
  *was = (lane_was_t){l->tick, l->recorded, l->last_use, l->joined, l->dirty, l->deferred};
  bool defer = live_defers(tr, d, s);
  uint64_t k = weft__clock_take(d, at, defer);
  atomic_store_explicit(&s->point, 0, memory_order_release); /* withdrawn: a failure takes k back */
  uint64_t stamp = stamp_of(d, at, defer);
  for (size_t i = 0; i < n; i++) {
    weft__access_state_t *a = uses[i].state;
    /* A write leaves reads[] as it is (its reader_mask is what it clears), so only a read keeps
     * its lane's entry (one cache line fewer for a write). */
    bool write = weft__rule_starts_history(uses[i].kind);
    undo[i] = (undo_t){a->write, a->reader_mask, write ? 0 : a->reads[at], a->last_use};
    note_access(a, at, k, uses[i].kind, stamp);
  }
  return defer;
}

/* Ends a busy use of s once its work was enqueued (ok) or failed (lock held): records the tick's
 * event unless it stays deferred (the use is recorded whatever happens to its event, as in
 * end_locked), or puts the histories and the lane back: nobody saw the tick, its lane was busy. */
static inline __attribute__((always_inline)) void finish_use(weft__tracker_t *tr, weft__domain_t *d,
                                                             weft_stream_t *s, const weft__use_t *uses, size_t n,
                                                             const undo_t *undo, const lane_was_t *was, bool defer,
                                                             bool ok) {
  unsigned at = s->lane;
  if (ok) {
    if (!defer) (void)weft__clock_flush(tr, d, s);
    tr->counters.uses++;
    tr->counters.accesses += n;
    s->last_used = ++tr->use_seq;
  } else {
    weft__lane_t *l = &d->lane[at];
    uint64_t stamp = defer ? l->last_use << 1 : 0; /* what reserve_use stamped a read with (0: none) */
    for (size_t i = n; i-- > 0;) {
      weft__access_state_t *a = uses[i].state;
      if (weft__rule_starts_history(uses[i].kind)) {
        /* A write: every other access of the block waited for this busy use; nothing else
         * changed its history meanwhile. */
        a->write = undo[i].write;
        a->reader_mask = undo[i].reader_mask; /* reads[] stayed as it was (reserve_use) */
        a->last_use = undo[i].last_use;
      } else {
        /* A read: other streams may have read the block meanwhile (a read waits for no read),
         * so only this lane's part of the history goes back. */
        weft__lanes_t bit = weft__lane_bit(at);
        a->reader_mask = (a->reader_mask & ~bit) | (undo[i].reader_mask & bit);
        a->reads[at] = undo[i].read;
        if (stamp != 0 && a->last_use == stamp) a->last_use = undo[i].last_use;
      }
    }
    l->tick = was->tick;
    l->recorded = was->recorded;
    l->last_use = was->last_use;
    l->dirty = was->dirty;
    l->deferred = was->deferred;
    l->joined = was->joined;
    WEFT__ROW(d, at)[at] = was->tick;
  }
  weft__clock_publish(d, at); /* reserve_use withdrew it */
}

/* Runs fn without the lock, the lanes of `busy` marked busy meanwhile; the lock is held on entry
 * and on return. */
static weft_status_t run_busy(weft__tracker_t *tr, weft__domain_t *d, weft__lanes_t busy,
                              weft_status_t (*fn)(weft_stream_t *s, void *arg), weft_stream_t *s, void *arg) {
  weft__lanes_add(&d->busy, busy);
  unlock(tr);
  weft_status_t st = fn(s, arg);
  lock(tr);
  weft__lanes_remove(&d->busy, busy);
  weft__clock_idle_signal();
  return st;
}

/* A live use's work enqueued without the lock (tracker.h, "Busy lanes"): the lock is held on
 * entry (after the use's waits) and on return. */
static weft_status_t use_unlocked(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *s, const weft__use_t *uses,
                                  size_t n, weft_status_t (*fn)(weft_stream_t *s, void *arg), void *arg) {
  undo_t small[16];
  undo_t *undo = weft__small_alloc(small, 16, n, sizeof *undo);
  if (undo == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: no host memory for %zu accesses", n);
  lane_was_t was;
  bool defer = reserve_use(tr, d, s, uses, n, undo, &was);
  weft_status_t st = run_busy(tr, d, weft__lane_bit(s->lane), fn, s, arg);
  finish_use(tr, d, s, uses, n, undo, &was, defer, st == WEFT_OK);
  weft__small_free(small, undo);
  return st;
}

/* The work is on the stream: the use is recorded whatever happens to its event (a failed record
 * leaves the tick pending; whoever needs it records it first, or fails without waiting). `defer`:
 * its tick stays pending (a live use where live_defers says so). */
static void end_locked(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *s, const weft__use_t *uses, size_t n,
                       bool defer) {
  uint64_t k;
  unsigned at = weft__at(d, s);
  uint64_t stamp = stamp_of(d, at, defer); /* before the record: its ring slot keeps the number */
  if (defer) k = weft__clock_defer(d, s);
  else (void)weft__clock_record(tr, d, s, &k);
  for (size_t i = 0; i < n; i++) note_access(uses[i].state, at, k, uses[i].kind, stamp);
  tr->counters.uses++;
  tr->counters.accesses += n;
  s->last_used = ++tr->use_seq;
}

static bool lane_is_valid(const weft__domain_t *d, unsigned s);

/* Room in every history for lane `at` to read (a lane of a runtime created after the block's):
 * grown to the domain's lanes now. HOST_OUT_OF_MEMORY changes nothing that matters (a grown
 * array only has more zeroes). */
static weft_status_t grow_reads(const weft__domain_t *d, unsigned at, const weft__use_t *uses, size_t n) {
  for (size_t i = 0; i < n; i++) {
    weft__access_state_t *a = uses[i].state;
    if (at < a->reads_cap) continue;
    uint64_t *r = weft__meta_realloc(a->reads, (size_t)d->n * sizeof *r);
    if (r == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: no host memory for a block's readers");
    memset(r + a->reads_cap, 0, (size_t)(d->n - a->reads_cap) * sizeof *r);
    a->reads = r;
    a->reads_cap = d->n;
  }
  return WEFT_OK;
}

/* A live use's accesses of lane `at` admitted (lock held): check_graph_memory and grow_reads in
 * one pass, the common case (no block of a graph, room for the lane) one test per access. */
static weft_status_t admit_live(const weft__domain_t *d, const weft_stream_t *s, unsigned at, const weft__use_t *uses,
                                size_t n) {
  for (size_t i = 0; i < n; i++) {
    const weft__access_state_t *a = uses[i].state;
    if (__builtin_expect(a->graph != NULL || at >= a->reads_cap, 0)) {
      weft_status_t st = check_graph_memory(NULL, s, uses, n);
      return st == WEFT_OK ? grow_reads(d, at, uses, n) : st;
    }
  }
  return WEFT_OK;
}

static uint64_t point_locked(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *s);

#define SMALL_USES 32

/* DO_RESTART (with DO_BEGIN, one live access): after the waits, the history restarts at s's
 * point, as a new block's on s (weft__tracker_free_kept). */
/* DO_FREE: a free; on an exposed stream work outside weft may precede it (PyTorch's kernels), so
 * s gets a pending tick: the free's point (the pool's stamp, a kept block's restart) is a new one,
 * recorded after the call, never an older one those kernels came after. */
enum { DO_BEGIN = 1, DO_END = 2, DO_OPEN = 4, DO_CLOSE = 8, DO_RESTART = 16, DO_FREE = 32 };

/* DO_FREE's step (lock held, live domain): on an exposed stream, a pending tick. */
static void free_point(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *s) {
  if (!atomic_load_explicit(&s->exposed, memory_order_relaxed)) return;
  unsigned at = weft__at(d, s);
  weft__lane_t *l = &d->lane[at];
  /* A pending tick, recorded when another stream or the host needs it (lazy records: the next
   * free's begin does not record it; weft__clock_slot records it for others, never into an
   * outside capture), or at the next begin on s. */
  if (tr->lazy && !l->eager) {
    (void)weft__clock_defer(d, s);
  } else {
    l->dirty = true;
    weft__clock_publish(d, at);
  }
}

/* DO_RESTART's step (lock held, live domain): block a's history starts again at s's point. */
static void restart_at(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *s, weft__access_state_t *a) {
  weft__access_init(a, a->reads, a->reads_cap);
  a->write = (weft__point_t){weft__at(d, s), point_locked(tr, d, s)};
}

/* Device timestamps (trace.h): a use's span begins before its work and ends after it (dropped
 * when the work failed). s->span is its stream's: touched under the lock, or by the use that
 * holds s's lane busy. */
static void span_begin(weft_stream_t *s) {
  weft__trace_device_drop(s->span);
  s->span = weft__trace_device_begin(s->tr->drv, s->tr->ordinal, s->index, s->raw);
}
static void span_end(weft_stream_t *s, weft_status_t st) {
  if (s->span == NULL) return;
  if (st == WEFT_OK) weft__trace_device_end(s->span, s->raw);
  else weft__trace_device_drop(s->span);
  s->span = NULL;
}

/* A live use's work with device timestamps, its span around fn, enqueued while s's lane is busy
 * (nobody else touches s->span then: every other use of s waits for the lane). */
typedef struct timed_work {
  weft_status_t (*fn)(weft_stream_t *s, void *arg);
  void *arg;
} timed_work_t;

static weft_status_t timed_work(weft_stream_t *s, void *arg) {
  const timed_work_t *t = arg;
  span_begin(s);
  weft_status_t st = t->fn(s, t->arg);
  span_end(s, st);
  return st;
}

/* The ways in: waits only, record only, both around `fn`, or the split form's open / close with
 * their checks. A live use with its work enqueues it without the lock (use_unlocked); the others
 * run under one lock hold. Inside a capture the uses act on capture-local histories (kinds go
 * into the access summary once, when the use begins). */
static weft_status_t run_use(weft_stream_t *s, const weft__use_t *uses, size_t n, unsigned what,
                             weft_status_t (*fn)(weft_stream_t *s, void *arg), void *arg, uint64_t print) {
  weft__tracker_t *tr = s->tr;
  weft__use_t small[SMALL_USES];
  const weft__use_t *du = uses;
  weft_status_t st;
  lock(tr);
again:
  st = WEFT_OK;
  wait_idle(tr, weft__lane_bit(s->lane)); /* s's own earlier use, enqueuing on another thread */
  weft__capture_t *c = s->capture;
  weft__domain_t *d = c != NULL ? &c->dom : tr->live;
  if ((what & DO_OPEN) && s->use_open) {
    st = weft__error(WEFT_ERR_BUSY, "weft_use_begin: stream %u already has an open use (weft_use_begin without "
                     "weft_use_end)", s->index);
  } else if ((what & DO_CLOSE) && !s->use_open) {
    st = weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_use_end: stream %u has no open use (no weft_use_begin)", s->index);
  } else if ((what & DO_CLOSE) && s->use_print != print) {
    st = weft__error(WEFT_ERR_INVALID_ARGUMENT,
                     "weft_use_end: the accesses differ from those given to weft_use_begin on stream %u", s->index);
  } else if (c == NULL) {
    st = admit_live(d, s, s->lane, uses, n);
  } else if ((st = check_graph_memory(c, s, uses, n)) != WEFT_OK) {
  } else {
    weft__use_t *t = weft__small_alloc(small, SMALL_USES, n, sizeof *t);
    st = t == NULL ? weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: no host memory for %zu accesses", n)
                   : translate(c, uses, n, t, (what & (DO_BEGIN | DO_OPEN)) != 0);
    du = t;
  }
  if (st == WEFT_OK) {
    weft__lanes_t busy = 0;
    if (what & (DO_BEGIN | DO_OPEN)) st = begin_locked(tr, d, s, du, n, &busy);
    if (st == WEFT_OK && busy != 0) {
      wait_idle(tr, busy);
      if (du != uses) weft__small_free(small, (void *)du);
      du = uses;
      goto again;
    }
    if (st == WEFT_OK && (what & DO_FREE) && c == NULL) free_point(tr, d, s);
    if (st == WEFT_OK && (what & DO_RESTART) && c == NULL) restart_at(tr, d, s, du[0].state);
    /* Device timestamps (trace.h): after the waits, before the record; live streams only. */
    bool timed = st == WEFT_OK && c == NULL && weft__trace_device_on();
    bool whole = (what & (DO_BEGIN | DO_END)) == (DO_BEGIN | DO_END); /* a use with its work, not a free */
    /* Every live use with its work enqueues it unlocked: the work may wait for room in a full
     * queue whose head waits for another thread's collective, which needs the lock
     * (tests/comm/test_comm_long, test_min_full_*queue_behind_an_all_reduce*). A per-thread
     * stream's use too (its tick is recorded by its owner after the work: it never defers, being
     * exposed), and one with device timestamps, its span recorded around the work. */
    if (st == WEFT_OK && whole && fn != NULL && c == NULL) {
      timed_work_t t = {fn, arg};
      st = timed ? use_unlocked(tr, d, s, du, n, timed_work, &t) : use_unlocked(tr, d, s, du, n, fn, arg);
      goto out;
    }
    if (timed && (whole || (what & DO_OPEN))) span_begin(s);
    if (st == WEFT_OK && fn != NULL) st = fn(s, arg);
    if (timed && (what & (DO_END | DO_CLOSE))) span_end(s, st);
    if (st == WEFT_OK && (what & (DO_END | DO_CLOSE)))
      end_locked(tr, d, s, du, n, d == tr->live && live_defers(tr, d, s));
    if (st == WEFT_OK && (what & DO_OPEN)) {
      s->use_open = true;
      s->use_print = print;
    }
    if (st == WEFT_OK && (what & DO_CLOSE)) s->use_open = false;
  }
out:
  if (du != uses) weft__small_free(small, (void *)du);
  WEFT_ASSERT_EXPENSIVE(lane_is_valid(d, weft__at(d, s)));
  unlock(tr);
  return st;
}

weft_status_t weft__tracker_free_begin(weft_stream_t *s, const weft__use_t *uses, size_t n) {
  return run_use(s, uses, n, DO_BEGIN | DO_FREE, NULL, NULL, 0);
}

weft_status_t weft__tracker_exact(weft_stream_t *s) {
  /* (A per-thread stream too: it has no pending tick to record, and its exactness is its ring's,
   * whose events any thread may query.) */
  if (atomic_load_explicit(&s->exact, memory_order_acquire)) return WEFT_OK;
  weft__tracker_t *tr = s->tr;
  lock_idle(s, NULL);
  /* The pending tick's record runs in s's context. */
  weft_status_t st = weft__tracker_bind(tr);
  if (st == WEFT_OK) st = weft__clock_exact(tr, tr->live, s);
  unlock(tr);
  return st;
}

weft_status_t weft__tracker_end(weft_stream_t *s, const weft__use_t *uses, size_t n) {
  return run_use(s, uses, n, DO_END, NULL, NULL, 0);
}

/* ---- the live fast path ---------------------------------------------------------------------
 * The common case of weft__tracker_use (every weft_launch) and of the split form's open and
 * close, in fewer instructions than run_use's general path: what a use costs on a GPU host grows
 * with the code it runs, more than with its data or its locks (bench/data/h100x1-bb56c9c). A
 * plain use (live_plain) takes the same steps as run_use takes for it; any other case, and every
 * error, is left to run_use, with nothing changed. tests/streams/test_fast_path compares them.
 * The helpers the fast path shares with run_use (needs_locked, issue_locked, reserve_use,
 * finish_use, ...) are always inline: GCC would keep them out of line, used from several places,
 * and each call adds code the use runs (bench/data/h200x2-ab81606/trim_ab). */

#define LIVE_USES WEFT__LIVE_USES /* accesses of a plain use: its undo records live on the stack */

/* Whether a use of s may take the fast path (lock held): a live use of at most LIVE_USES
 * accesses on a stream that takes part in no capture, is no per-thread stream and is not busy,
 * no device timestamps, and every block of no graph with room for s's lane (admit_live's
 * common case). */
static inline __attribute__((always_inline)) bool live_plain(const weft__tracker_t *tr, const weft__domain_t *d,
                                                             const weft_stream_t *s, const weft__use_t *uses,
                                                             size_t n) {
  unsigned at = s->lane;
  if (n > LIVE_USES || tr->no_fast_path || s->capture != NULL || s->per_thread || weft__lanes_atomic_has(&d->busy, at) ||
      weft__trace_device_on())
    return false;
  for (size_t i = 0; i < n; i++)
    if (uses[i].state->graph != NULL || at >= uses[i].state->reads_cap) return false;
  return true;
}

/* A plain use's waits (begin_locked), into *st; false, nothing changed, when a lane it needs is
 * busy (run_use waits for it). */
static inline __attribute__((always_inline)) bool live_begin(weft__tracker_t *tr, weft__domain_t *d,
                                                             weft_stream_t *s, const weft__use_t *uses, size_t n,
                                                             weft_status_t *st) {
  needs_t nd;
  weft__lanes_t busy;
  (void)needs_locked(tr, d, s, uses, n, &nd, &busy);
  if (busy != 0) return false;
  bool issues = issue_calls_driver(d, s, &nd);
  *st = issues ? weft__tracker_bind_for(tr, s) : WEFT_OK;
  if (*st == WEFT_OK && issues) *st = issue_locked(tr, d, s, &nd);
  return true;
}

/* A deferred use's counting, done before its work (the lock held): the tracker's use counters and
 * s's place in the least-recently-used order; returns s->last_used as it was, which
 * uncount_deferred puts back after a failed work. */
static inline __attribute__((always_inline)) uint64_t count_deferred(weft__tracker_t *tr, weft_stream_t *s,
                                                                     size_t n) {
  uint64_t was = s->last_used;
  tr->counters.uses++;
  tr->counters.accesses += n;
  s->last_used = ++tr->use_seq;
  return was;
}

static void uncount_deferred(weft__tracker_t *tr, weft_stream_t *s, size_t n, uint64_t last_used) {
  tr->counters.uses--;
  tr->counters.accesses -= n;
  s->last_used = last_used;
}

/* A deferred fast use whose work failed: under the lock again, what it counted is taken back,
 * its histories and lane are put back (finish_use), and the lane is cleared. */
void weft__tracker_exit_failed(weft__use_ticket_t *t) {
  weft_stream_t *s = t->s;
  weft__tracker_t *tr = s->tr;
  weft__domain_t *d = tr->live;
  lock(tr);
  uncount_deferred(tr, s, t->n, t->last_used);
  finish_use(tr, d, s, t->uses, t->n, t->undo, &t->was, true, false);
  weft__lanes_remove(&d->busy, weft__lane_bit(s->lane));
  weft__clock_idle_signal();
  WEFT_ASSERT_EXPENSIVE(lane_is_valid(d, s->lane));
  unlock(tr);
}

/* A plain use that leaves its tick deferred (lazy records), its waits issued (lock held): records
 * its accesses at the pending tick and finishes everything but the stream's published point
 * (finish_use's success), marks its lane busy and releases the lock. Its work then runs, and
 * weft__tracker_exit ends it without the lock (or, after a failure, puts everything back). */
static inline __attribute__((always_inline)) void live_enter_deferred(weft__tracker_t *tr, weft__domain_t *d,
                                                                      weft_stream_t *s, const weft__use_t *uses,
                                                                      size_t n, weft__use_ticket_t *t) {
  (void)reserve_use(tr, d, s, uses, n, t->undo, &t->was); /* (defers: the caller asked live_defers) */
  t->s = s;
  t->uses = uses;
  t->n = n;
  t->last_used = count_deferred(tr, s, n);
  t->point = weft__clock_published(d, s->lane, s); /* (published after the work) */
  weft__lanes_add(&d->busy, weft__lane_bit(s->lane));
  unlock(tr);
}

bool weft__tracker_enter(weft_stream_t *s, const weft__use_t *uses, size_t n, weft__use_ticket_t *t,
                         weft_status_t *st) {
  weft__tracker_t *tr = s->tr;
  lock(tr);
  weft__domain_t *d = tr->live;
  if (!live_plain(tr, d, s, uses, n) || !live_defers(tr, d, s) || !live_begin(tr, d, s, uses, n, st)) {
    unlock(tr);
    return false;
  }
  tr->fast_uses++;
  if (*st != WEFT_OK) {
    unlock(tr);
    return true;
  }
  live_enter_deferred(tr, d, s, uses, n, t);
  return true;
}

/* weft__tracker_use's fast path: false, the lock released, where run_use must take the use.
 * A use that leaves its tick deferred (lazy records: the common case) is finished before its
 * work is enqueued, its lane busy meanwhile (tracker.h, "Busy lanes": nobody observes it), and
 * after the work only its point is published and its lane cleared, without the lock
 * (weft__tracker_exit): the same bookkeeping costs 58-112 ns less on an H200 host all before the
 * driver's launch than around it (bench/data/h200-driver-share-115f37d). A use that records its
 * event after the work takes the lock again (run_busy). */
static inline __attribute__((always_inline)) bool use_live(weft_stream_t *s, const weft__use_t *uses, size_t n,
                     weft_status_t (*fn)(weft_stream_t *s, void *arg), void *arg, weft_status_t *out) {
  weft__tracker_t *tr = s->tr;
  lock(tr);
  weft__domain_t *d = tr->live;
  weft_status_t st;
  if (!live_plain(tr, d, s, uses, n) || !live_begin(tr, d, s, uses, n, &st)) {
    unlock(tr);
    return false;
  }
  tr->fast_uses++;
  if (st == WEFT_OK && live_defers(tr, d, s)) {
    weft__use_ticket_t t;
    live_enter_deferred(tr, d, s, uses, n, &t);
    *out = weft__tracker_exit(&t, fn(s, arg));
    return true;
  }
  if (st == WEFT_OK) {
    undo_t undo[LIVE_USES];
    lane_was_t was;
    bool defer = reserve_use(tr, d, s, uses, n, undo, &was);
    st = run_busy(tr, d, weft__lane_bit(s->lane), fn, s, arg);
    finish_use(tr, d, s, uses, n, undo, &was, defer, st == WEFT_OK);
  }
  WEFT_ASSERT_EXPENSIVE(lane_is_valid(d, s->lane));
  unlock(tr);
  *out = st;
  return true;
}

/* The split form's fast path, open (its waits) or close (its record): false, the lock released,
 * where run_use must take it (its errors too: a second open, a close without an open or with
 * other accesses). */
static inline __attribute__((always_inline)) bool split_live(weft_stream_t *s, const weft__use_t *uses, size_t n,
                                                             uint64_t print, bool open, weft_status_t *out) {
  weft__tracker_t *tr = s->tr;
  lock(tr);
  weft__domain_t *d = tr->live;
  weft_status_t st = WEFT_OK;
  if (!live_plain(tr, d, s, uses, n) || s->use_open == open || (!open && s->use_print != print) ||
      (open && !live_begin(tr, d, s, uses, n, &st))) {
    unlock(tr);
    return false;
  }
  tr->fast_uses++;
  /* The close records its event unless its tick stays pending (end_locked). */
  bool defer = !open && live_defers(tr, d, s);
  if (st == WEFT_OK && !open && !defer) st = weft__tracker_bind_for(tr, s);
  if (st == WEFT_OK && !open) end_locked(tr, d, s, uses, n, defer);
  if (st == WEFT_OK) {
    s->use_open = open;
    s->use_print = print;
  }
  WEFT_ASSERT_EXPENSIVE(lane_is_valid(d, s->lane));
  unlock(tr);
  *out = st;
  return true;
}

/* weft__tracker_free_kept's fast path (weft_free's common case, a live free into s's cache): the
 * steps of run_use's DO_BEGIN | DO_RESTART | DO_FREE, the context bound only where the waits make
 * a driver call (weft_free's fast path did not bind it). False, the lock released, where run_use
 * must take the free. */
static bool free_live(weft_stream_t *s, const weft__use_t *use, weft_status_t *out) {
  weft__tracker_t *tr = s->tr;
  lock(tr);
  weft__domain_t *d = tr->live;
  weft_status_t st;
  if (!live_plain(tr, d, s, use, 1) || !live_begin(tr, d, s, use, 1, &st)) {
    unlock(tr);
    return false;
  }
  tr->fast_frees++;
  if (st == WEFT_OK) {
    free_point(tr, d, s);
    restart_at(tr, d, s, use->state);
  }
  WEFT_ASSERT_EXPENSIVE(lane_is_valid(d, s->lane));
  unlock(tr);
  *out = st;
  return true;
}

weft_status_t weft__tracker_free_kept(weft_stream_t *s, weft__access_state_t *st) {
  weft__use_t use = {st, 2u /* WEFT_WRITE */, 0};
  weft_status_t r;
  if (free_live(s, &use, &r)) return r;
  return (r = weft__tracker_bind(s->tr)) == WEFT_OK ? run_use(s, &use, 1, DO_BEGIN | DO_RESTART | DO_FREE, NULL, NULL, 0)
                                                  : r;
}

weft_status_t weft__tracker_use(weft_stream_t *s, const weft__use_t *uses, size_t n,
                                weft_status_t (*fn)(weft_stream_t *s, void *arg), void *arg) {
  weft_status_t st;
  return use_live(s, uses, n, fn, arg, &st) ? st : run_use(s, uses, n, DO_BEGIN | DO_END, fn, arg, 0);
}

/* Per stream of a joint use: its lane as it was, the lanes it waits for and their ticks, and for
 * a deferred group (every stream's tick stays deferred) s->last_used as it was and the point s
 * publishes after the work. */
typedef struct joint_stream {
  lane_was_t was;
  needs_t need;
  uint64_t last_used, point;
} joint_stream_t;

/* A group whose every stream leaves its tick deferred (lazy records: the common case), its uses
 * reserved (lock held): as weft__tracker_enter / weft__tracker_exit for each stream, the uses are
 * finished before the work, the lanes busy while it is enqueued and cleared after it without the
 * lock; a failed work takes the lock again and puts every stream back, the last first. Returns
 * with the lock released. */
static weft_status_t joint_deferred(weft__domain_t *d, weft_stream_t *const *s, weft__use_t *const *uses,
                                    const size_t *n, size_t k, size_t total, const undo_t *undo, joint_stream_t *js,
                                    weft__lanes_t lanes, weft_status_t (*fn)(weft_stream_t *s, void *arg), void *arg) {
  weft__tracker_t *tr0 = s[0]->tr;
  for (size_t i = 0; i < k; i++) {
    js[i].last_used = count_deferred(s[i]->tr, s[i], n[i]);
    js[i].point = weft__clock_published(d, s[i]->lane, s[i]);
  }
  weft__lanes_add(&d->busy, lanes);
  unlock(tr0);
  weft_status_t st = fn(s[0], arg);
  if (st == WEFT_OK) {
    for (size_t i = 0; i < k; i++) atomic_store_explicit(&s[i]->point, js[i].point, memory_order_release);
    weft__lanes_remove(&d->busy, lanes);
    weft__cond_broadcast_unlocked(&weft__clock_idle);
    return WEFT_OK;
  }
  lock(tr0);
  for (size_t i = k, off = total; i-- > 0;) {
    off -= n[i];
    uncount_deferred(s[i]->tr, s[i], n[i], js[i].last_used);
    finish_use(s[i]->tr, d, s[i], uses[i], n[i], undo + off, &js[i].was, true, false);
  }
  weft__lanes_remove(&d->busy, lanes);
  weft__clock_idle_signal();
  for (size_t i = 0; i < k; i++) WEFT_ASSERT_EXPENSIVE(lane_is_valid(d, s[i]->lane));
  unlock(tr0);
  return st;
}

weft_status_t weft__tracker_use_joint(weft_stream_t *const *s, weft__use_t *const *uses, const size_t *n, size_t k,
                                      weft_status_t (*fn)(weft_stream_t *s, void *arg), void *arg) {
  if (k == 0) return WEFT_OK;
  if (k > 64) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft: a joint use of %zu streams (at most 64)", k);
  weft__tracker_t *tr0 = s[0]->tr;
  size_t total = 0;
  for (size_t i = 0; i < k; i++) total += n[i];
  undo_t small_undo[32];
  joint_stream_t small_js[4];
  undo_t *undo = weft__small_alloc(small_undo, 32, total, sizeof *undo);
  joint_stream_t *js = weft__small_alloc(small_js, 4, k, sizeof *js);
  weft_status_t st = undo != NULL && js != NULL ? WEFT_OK
                                                : weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: no host memory for a joint use");
  weft__lanes_t lanes = 0;
  uint64_t defer = 0; /* bit i: stream i's tick stays deferred */
  for (size_t i = 0; i < k; i++) lanes |= weft__lane_bit(s[i]->lane);
  if (st != WEFT_OK) goto done;
  lock(tr0);
  weft__domain_t *d = tr0->live;
again:
  wait_idle(tr0, lanes);
  weft__lanes_t busy = 0;
  for (size_t i = 0; i < k && st == WEFT_OK; i++) {
    if (s[i]->capture != NULL || s[i]->per_thread)
      st = weft__error(WEFT_ERR_CAPTURE, "weft: stream %u of a joint use began capturing meanwhile", s[i]->index);
    else if ((st = admit_live(d, s[i], s[i]->lane, uses[i], n[i])) == WEFT_OK) {
      weft__lanes_t b;
      (void)needs_locked(s[i]->tr, d, s[i], uses[i], n[i], &js[i].need, &b);
      busy |= b;
    }
  }
  if (st != WEFT_OK) goto out;
  if (busy != 0) { /* every stream looks again once the lanes they need are idle */
    wait_idle(tr0, busy);
    goto again;
  }
  /* The waits; a stream's context is bound only when it gets a driver call. */
  for (size_t i = 0; i < k && st == WEFT_OK; i++) {
    if (issue_calls_driver(d, s[i], &js[i].need) && (st = weft__tracker_bind(s[i]->tr)) != WEFT_OK) break;
    st = issue_locked(s[i]->tr, d, s[i], &js[i].need);
  }
  if (st != WEFT_OK) goto out; /* waits issued stay (harmless, conservative); nothing recorded */
  for (size_t i = 0, off = 0; i < k; off += n[i], i++)
    if (reserve_use(s[i]->tr, d, s[i], uses[i], n[i], undo + off, &js[i].was)) defer |= 1ull << i;
  if (defer == (k == 64 ? ~0ull : (1ull << k) - 1)) {
    st = joint_deferred(d, s, uses, n, k, total, undo, js, lanes, fn, arg);
    goto done;
  }
  st = run_busy(tr0, d, lanes, fn, s[0], arg);
  /* Last reserved, first finished: two streams of the group may touch one block, and a later
   * stream's undo holds what an earlier one reserved, so a failure puts them back in reverse. */
  for (size_t i = k, off = total; i-- > 0;) {
    off -= n[i];
    bool keep = (defer >> i) & 1;
    if (st == WEFT_OK && !keep) (void)weft__tracker_bind(s[i]->tr); /* a failed bind makes the record fail: it stays pending */
    finish_use(s[i]->tr, d, s[i], uses[i], n[i], undo + off, &js[i].was, keep, st == WEFT_OK);
  }
out:
  unlock(tr0);
done:
  if (undo != NULL) weft__small_free(small_undo, undo);
  if (js != NULL) weft__small_free(small_js, js);
  return st;
}

weft_status_t weft__tracker_bracket(weft_stream_t *s, const weft__use_t *uses, size_t n, uint64_t print, bool open) {
  weft_status_t st;
  if (split_live(s, uses, n, print, open, &st)) return st;
  return (st = weft__tracker_bind(s->tr)) == WEFT_OK ? run_use(s, uses, n, open ? DO_OPEN : DO_CLOSE, NULL, NULL, print)
                                                   : st;
}

uint64_t weft__tracker_fingerprint(const weft__use_t *uses, size_t n) {
  uint64_t sum = n; /* order-independent: a sum of each access mixed on its own */
  for (size_t i = 0; i < n; i++) sum += weft__tracker_print_one(uses[i].state, uses[i].kind);
  return sum;
}

weft_status_t weft__tracker_new_block(weft_stream_t *s, weft__access_state_t *st, uint64_t gen) {
  weft__tracker_t *tr = s->tr;
  weft_status_t r = WEFT_OK;
  lock_idle(s, NULL);
  weft__capture_t *c = s->capture;
  weft__domain_t *d = c != NULL ? &c->dom : tr->live;
  weft__point_t at = {weft__at(d, s), point_locked(tr, d, s)};
  if (c == NULL) {
    st->write = at;
  } else {
    weft__capture_block_t *b = weft__capture_block(c, st, true);
    if (b == NULL) r = weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_alloc: no host memory for a capture record");
    else {
      b->local.write = at;
      b->gen = gen;
    }
    if (b != NULL) st->graph = c;
  }
  unlock(tr);
  return r;
}

void weft__tracker_free_block(weft_stream_t *s, weft__access_state_t *st) {
  lock(s->tr);
  weft__capture_t *c = s->capture;
  weft__capture_block_t *b = c != NULL ? weft__capture_find(c, st) : NULL;
  if (b != NULL && b->internal) b->freed = true;
  unlock(s->tr);
}

weft_status_t weft__tracker_hold(weft_stream_t *s, const char *fn) {
  weft_status_t st = WEFT_OK;
  lock(s->tr);
  if (s->capture != NULL) st = weft__error(WEFT_ERR_CAPTURE, "%s: stream %u is capturing", fn, s->index);
  else s->holds++;
  unlock(s->tr);
  return st;
}

weft_stream_t *weft__tracker_hold_live(weft__tracker_t *tr, const char *fn) {
  /* Streams nobody outside weft has seen first (weft knows all their captures); an exposed one
   * only after asking the driver, as code outside weft may have begun a capture on it. */
  for (int pass = 0; pass < 2; pass++)
    for (unsigned i = 0; i < tr->n_pool; i++) {
      weft_stream_t *s = &tr->streams[i];
      if (atomic_load_explicit(&s->exposed, memory_order_relaxed) != (pass == 1)) continue;
      lock(tr);
      bool free_of_captures = s->capture == NULL;
      if (free_of_captures) s->holds++;
      unlock(tr);
      if (!free_of_captures) continue;
      bool active = false;
      uint64_t id;
      if (pass == 1 && (weft__capture_probe(s, &active, &id) != WEFT_OK || active)) {
        weft__tracker_unhold(s);
        continue;
      }
      return s;
    }
  weft__error(WEFT_ERR_CAPTURE, "%s: every pool stream takes part in a capture", fn);
  return NULL;
}

void weft__tracker_unhold(weft_stream_t *s) {
  lock(s->tr);
  if (--s->holds == 0) weft__cond_broadcast(&s->tr->unheld);
  unlock(s->tr);
}

unsigned weft__tracker_trace_tid(weft_stream_t *s) {
  lock(s->tr);
  uint64_t id = s->capture != NULL ? s->capture->id : 0;
  unlock(s->tr);
  return weft__trace_tid(s->index, id);
}

weft__capture_t *weft__tracker_capture_of(weft_stream_t *s, weft_resource_t **alloc_to) {
  /* The pointer alone needs no lock (it is written under the lock, atomically; the hot check of
   * resource calls reads it inline: weft__tracker_in_capture). */
  weft__capture_t *c = atomic_load_explicit(&s->capture, memory_order_acquire);
  if (alloc_to == NULL) return c;
  if (c == NULL) { /* none: nothing to read under the lock */
    *alloc_to = NULL;
    return NULL;
  }
  lock(s->tr);
  c = s->capture;
  *alloc_to = c != NULL ? c->alloc_to : NULL;
  unlock(s->tr);
  return c;
}

/* ---- points and ordering ------------------------------------------------------------------------- */

/* A per-thread stream's tick is recorded as soon as it is handed out: only its owner may record
 * on it. (A failed record leaves it pending, as for any stream; whoever needs it then fails.) */
static uint64_t point_locked(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *s) {
  uint64_t k = weft__clock_point(d, s);
  if (s->per_thread) (void)weft__clock_flush(tr, d, s);
  return k;
}

weft__point_t weft__tracker_point(weft_stream_t *s) {
  /* The published point, where there is one (weft_stream_t.point): no lock. */
  if (atomic_load_explicit(&s->capture, memory_order_acquire) == NULL) {
    uint64_t k = atomic_load_explicit(&s->point, memory_order_acquire);
    if (k != 0) return (weft__point_t){s->lane, k - 1};
  }
  lock_idle(s, NULL);
  weft__domain_t *d = weft__clock_domain(s->tr, s);
  weft__point_t p = {weft__at(d, s), point_locked(s->tr, d, s)};
  unlock(s->tr);
  return p;
}

bool weft__tracker_is_ordered(weft_stream_t *s, weft__point_t p) {
  weft__tracker_t *tr = s->tr;
  lock(tr);
  weft__domain_t *d = weft__clock_domain(tr, s);
  bool ok = p.stream >= d->n || weft__clock_implied(d, weft__at(d, s), p.stream, p.tick);
  unlock(tr);
  return ok;
}

weft_status_t weft__tracker_order(weft_stream_t *s, weft__point_t p) {
  weft__tracker_t *tr = s->tr;
  weft_status_t st = WEFT_OK;
  lock_idle(s, &p);
  weft__domain_t *d = weft__clock_domain(tr, s);
  if (p.stream < d->n && d->stream[p.stream] != NULL && !weft__clock_implied(d, weft__at(d, s), p.stream, p.tick)) {
    st = weft__clock_flush(tr, d, s);
    weft__clock_needed(tr, d, d->stream[p.stream], p.tick, false);
    if (st == WEFT_OK) st = weft__clock_wait(tr, d, s, d->stream[p.stream], p.tick);
  }
  unlock(tr);
  return st;
}

size_t weft__tracker_conflicts(weft__tracker_t *tr, const weft__access_state_t *st, unsigned kind, weft__point_t *out) {
  size_t c = 0;
  lock(tr);
  if (st->write.tick != 0) out[c++] = st->write;
  if (weft__rule_follows_reads(kind))
    for (weft__lanes_t m = st->reader_mask; m != 0; m &= m - 1) {
      unsigned t = weft__lanes_first(m);
      out[c++] = (weft__point_t){t, st->reads[t]};
    }
  unlock(tr);
  return c;
}

weft_stream_t *weft__tracker_auto(weft__tracker_t *tr, bool high, const weft__use_t *uses, size_t n) {
  lock(tr);
  weft_stream_t *best = NULL;
  unsigned best_waits = ~0u;
  unsigned first = high ? tr->n_pool - tr->n_high : 0, last = high ? tr->n_pool : tr->n_pool - tr->n_high;
  needs_t need;
  uint64_t skipped = tr->counters.waits_skipped, host = tr->counters.waits_host_known;
  for (unsigned c = first; c < last; c++) {
    weft_stream_t *s = &tr->streams[c];
    if (s->capture != NULL) continue; /* a capturing stream is not free for eager work */
    weft__lanes_t m = collect_needs(tr, tr->live, s->lane, uses, n, &need);
    unsigned waits = (unsigned)__builtin_popcountll((uint64_t)m) + (unsigned)__builtin_popcountll((uint64_t)(m >> 64));
    if (best == NULL || waits < best_waits || (waits == best_waits && s->last_used < best->last_used)) {
      best = s;
      best_waits = waits;
    }
  }
  /* collect_needs counted skips for every candidate: only the chosen use will count them. */
  tr->counters.waits_skipped = skipped;
  tr->counters.waits_host_known = host;
  unlock(tr);
  return best;
}

void weft__tracker_expose(weft_stream_t *s) {
  if (atomic_load_explicit(&s->exposed, memory_order_relaxed)) return;
  lock_idle(s, NULL);
  atomic_store_explicit(&s->exposed, true, memory_order_relaxed);
  weft__domain_t *d = s->tr->live;
  if (s->capture == NULL && d->lane[s->lane].deferred) (void)weft__clock_flush(s->tr, d, s);
  unlock(s->tr);
}

weft_status_t weft__tracker_record_pending(weft__tracker_t *tr) {
  weft_status_t first = WEFT_OK;
  for (unsigned i = 0; i < tr->n && weft__tracker_lane_used(tr, i); i++) {
    weft_stream_t *s = &tr->streams[i];
    if (!atomic_load_explicit(&s->exposed, memory_order_relaxed) || s->per_thread) continue;
    lock_idle(s, NULL);
    weft__domain_t *d = tr->live;
    weft_status_t st = s->capture != NULL ? WEFT_OK : weft__clock_settle(tr, d, s);
    unlock(tr);
    if (st != WEFT_OK && st != WEFT_ERR_CAPTURE && first == WEFT_OK) first = st;
  }
  return first;
}

void weft__tracker_touch(weft_stream_t *s) {
  lock_idle(s, NULL);
  weft__domain_t *d = weft__clock_domain(s->tr, s);
  d->lane[weft__at(d, s)].dirty = true;
  weft__clock_publish(d, weft__at(d, s));
  unlock(s->tr);
}

weft_status_t weft__tracker_import_event(weft_stream_t *s, CUevent ev) {
  weft__tracker_t *tr = s->tr;
  lock_idle(s, NULL);
  weft__capture_t *c = s->capture;
  weft__domain_t *d = c != NULL ? &c->dom : tr->live;
  weft_status_t st = weft__clock_flush(tr, d, s);
  if (st == WEFT_OK) {
    /* Inside a capture, an event recorded outside it is waited on as an external dependency. */
    CUresult r = tr->drv->cuStreamWaitEvent(s->raw, ev, c != NULL ? CU_EVENT_WAIT_EXTERNAL : 0);
    if (r != CUDA_SUCCESS) st = weft__driver_fail(r, "cuStreamWaitEvent");
    else {
      d->lane[weft__at(d, s)].dirty = true;
      weft__clock_publish(d, weft__at(d, s));
    }
  }
  unlock(tr);
  return st;
}

/* ---- host knowledge ---------------------------------------------------------------------------- */

/* The host saw (t, tick) complete: so is everything in that event's clock. */
static void learn_complete(weft__tracker_t *tr, unsigned t, const uint64_t *snap, unsigned n, uint64_t tick) {
  weft__domain_t *d = tr->live;
  for (unsigned u = 0; u < n; u++) d->host_known[u] = weft__max_u64(d->host_known[u], snap[u]);
  d->host_known[t] = weft__max_u64(d->host_known[t], tick);
}

bool weft__tracker_poll(weft__tracker_t *tr, weft__point_t p) {
  if (p.tick == 0) return true;
  bool done = false;
  lock(tr);
  weft__domain_t *d = tr->live;
  if (p.stream >= d->n || d->stream[p.stream] == NULL || d->host_known[p.stream] >= p.tick) {
    done = true; /* (a lane given back: its runtime synchronised everything) */
  } else if (weft__lanes_atomic_has(&d->busy, p.stream)) {
    done = false; /* its use is enqueuing (tracker.h, "Busy lanes"): look again later */
  } else {
    unsigned slot;
    CUresult r = CUDA_ERROR_NOT_READY;
    if (weft__clock_slot(tr, d, d->stream[p.stream], p.tick, &slot) == WEFT_OK)
      WEFT__RELAXED(tr->drv, r = tr->drv->cuEventQuery(d->lane[p.stream].ring[slot]));
    if (r == CUDA_SUCCESS) {
      const weft__lane_t *l = &d->lane[p.stream];
      learn_complete(tr, p.stream, &l->ring_clock[(size_t)slot * d->stride], d->n, l->ring_tick[slot]);
      done = true;
    }
  }
  unlock(tr);
  return done;
}

/* Blocks on the points' events without the lock, then records the host's knowledge. */
weft_status_t weft__tracker_sync_points(weft__tracker_t *tr, const weft__point_t *pts, size_t n) {
  weft__domain_t *d = tr->live;
  for (size_t i = 0; i < n; i++) {
    weft__point_t p = pts[i];
    if (p.tick == 0) continue;
    uint64_t snap[WEFT__MAX_LANES];
    lock(tr);
    if (p.stream < WEFT__MAX_LANES) wait_idle(tr, weft__lane_bit(p.stream));
    if (p.stream >= d->n || d->stream[p.stream] == NULL || d->host_known[p.stream] >= p.tick) {
      unlock(tr);
      continue;
    }
    unsigned slot;
    weft_status_t st = weft__clock_slot(tr, d, d->stream[p.stream], p.tick, &slot);
    if (st != WEFT_OK) {
      unlock(tr);
      return st;
    }
    /* Copy the clock now: the slot may be re-recorded once the lock is dropped; the event we
     * then wait for is newer and covers this snapshot. */
    const weft__lane_t *l = &d->lane[p.stream];
    unsigned n_lanes = d->n;
    memcpy(snap, &l->ring_clock[(size_t)slot * d->stride], n_lanes * sizeof(uint64_t));
    uint64_t tick = l->ring_tick[slot];
    if (tick != p.tick) tr->counters.ring_evictions++; /* the host waits on a newer event */
    CUevent ev = l->ring[slot];
    unlock(tr);
    CUresult r;
    WEFT__RELAXED(tr->drv, r = tr->drv->cuEventSynchronize(ev));
    if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuEventSynchronize");
    lock(tr);
    learn_complete(tr, p.stream, snap, n_lanes, tick);
    unlock(tr);
  }
  return WEFT_OK;
}

/* Shared by sync and query: run `wait` on the raw stream, then learn everything s had enqueued
 * when we looked. */
static weft_status_t host_wait_stream(weft_stream_t *s, bool blocking) {
  weft__tracker_t *tr = s->tr;
  weft__domain_t *d = tr->live;
  uint64_t snap[WEFT__MAX_LANES];
  weft_status_t st = weft__tracker_hold(s, blocking ? "weft_stream_synchronize" : "weft_stream_query");
  if (st != WEFT_OK) return st;
  lock_idle(s, NULL);
  WEFT__TEST_POINT("host_wait_stream: held", s);
  /* The tick the host will know complete must be recorded: work enqueued later may not join it
   * (clock.c), or it would count as complete too. An exposed stream is not synchronised: code
   * outside weft may begin a capture on it at any moment, which a synchronisation would
   * invalidate; a new tick's event, recorded with the driver asked before and after, covers its
   * work instead (work outside weft too). Another thread's per-thread default stream cannot be
   * named from here: its newest event (it has no pending tick) covers its work. */
  bool owns = weft__tracker_owns(s), exposed = owns && atomic_load_explicit(&s->exposed, memory_order_relaxed);
  uint64_t tick;
  if (exposed) {
    st = weft__clock_record_for_host(tr, d, s, &tick);
  } else {
    /* Work or waits enqueued since the newest tick (a dirty lane: a wait, the async resource's
     * calls) get the pending tick first, recorded here: else the host would learn only the older
     * tick, and a point taken after this wait (a pool's free stamp) would be a new tick it does
     * not know complete (a trim right after kept its chunk: tests/streams
     * test_outside_long_lazy_short, seed 574). Never on another thread's per-thread stream. */
    if (owns) (void)weft__clock_point(d, s);
    st = weft__clock_flush(tr, d, s);
    tick = d->lane[s->lane].recorded;
  }
  unsigned n_lanes = d->n;
  memcpy(snap, WEFT__ROW(d, s->lane), n_lanes * sizeof(uint64_t));
  CUevent ev = (!owns || exposed) && tick != 0 ? d->lane[s->lane].ring[tick & (d->lane[s->lane].ring_size - 1)] : NULL;
  bool nothing = ev == NULL && (!owns || exposed);
  unlock(tr);
  if (st != WEFT_OK) {
    weft__tracker_unhold(s);
    return st;
  }
  CUresult r = CUDA_SUCCESS;
  if (ev != NULL)
    WEFT__RELAXED(tr->drv, r = blocking ? tr->drv->cuEventSynchronize(ev) : tr->drv->cuEventQuery(ev));
  else if (!nothing)
    WEFT__RELAXED(tr->drv, r = blocking ? tr->drv->cuStreamSynchronize(s->raw) : tr->drv->cuStreamQuery(s->raw));
  weft__tracker_unhold(s);
  if (r != CUDA_SUCCESS) return weft__driver_fail(r, blocking ? "cuStreamSynchronize" : "cuStreamQuery");
  lock(tr);
  learn_complete(tr, s->lane, snap, n_lanes, tick);
  unlock(tr);
  return WEFT_OK;
}

weft_status_t weft__tracker_sync_stream(weft_stream_t *s) { return host_wait_stream(s, true); }
weft_status_t weft__tracker_query_stream(weft_stream_t *s) { return host_wait_stream(s, false); }

weft_status_t weft__tracker_sync_all(weft__tracker_t *tr) {
  for (unsigned i = 0; i < tr->n && weft__tracker_lane_used(tr, i); i++) {
    weft_status_t st = weft__tracker_sync_stream(&tr->streams[i]);
    if (st != WEFT_OK) return st;
  }
  return WEFT_OK;
}

/* ---- invariants ------------------------------------------------------------------------------ */

/* Stream s's clock in domain d: its own entry, its pending tick, its ring's snapshots. */
static bool lane_is_valid(const weft__domain_t *d, unsigned s) {
  const weft__lane_t *l = &d->lane[s];
  const uint64_t *row = WEFT__ROW(d, s);
  if (row[s] != l->tick) return weft__debug_report("tracker", "known[s][s] != tick[s]");
  if (l->recorded > l->tick) return weft__debug_report("tracker", "recorded tick beyond tick");
  if (l->tick - l->recorded > 1) return weft__debug_report("tracker", "more than one pending tick");
  const weft_stream_t *st = d->capture == NULL ? d->stream[s] : NULL;
  if (st != NULL && !weft__lanes_atomic_has(&d->busy, s) &&
      atomic_load_explicit(&st->point, memory_order_relaxed) != (l->dirty || st->per_thread ? 0 : l->tick + 1))
    return weft__debug_report("tracker", "published point differs from the lane's");
  for (unsigned t = 0; t < d->n; t++) {
    if (row[t] > d->lane[t].tick) return weft__debug_report("tracker", "known beyond the other stream's tick");
    if (d->host_known[t] > d->lane[t].tick) return weft__debug_report("tracker", "host knows a future tick");
  }
  if (l->ring_tick == NULL) return true;
  for (unsigned slot = 0; slot < l->ring_size; slot++) {
    if (l->ring_tick[slot] == 0) continue;
    if (l->ring_tick[slot] > l->recorded) return weft__debug_report("tracker", "ring slot newer than recorded");
    if ((l->ring_tick[slot] & (l->ring_size - 1)) != slot) return weft__debug_report("tracker", "tick in a foreign slot");
    const uint64_t *snap = &l->ring_clock[(size_t)slot * d->stride];
    for (unsigned t = 0; t < d->n; t++)
      if (snap[t] > row[t]) return weft__debug_report("tracker", "ring snapshot ahead of the stream's row");
  }
  return true;
}

static bool domain_is_valid(const weft__domain_t *d) {
  for (unsigned s = 0; s < d->n; s++)
    if (!lane_is_valid(d, s)) return false;
  return true;
}

bool weft__tracker_is_valid(weft__tracker_t *tr) {
  lock(tr);
  bool ok = domain_is_valid(tr->live);
  for (unsigned s = 0; s < tr->n && ok; s++) {
    weft__capture_t *c = tr->streams[s].capture;
    if (c != NULL && c->origin == &tr->streams[s]) ok = domain_is_valid(&c->dom);
  }
  unlock(tr);
  return ok;
}
