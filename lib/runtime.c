/* The runtime per device: registry, reference counting, the resource stack built from options,
 * counters, and the stream-pool part of the public API. */
#include <inttypes.h>
#include <string.h>

#include "lib/core/debug.h"
#include "lib/core/error.h"
#include "lib/core/meta.h"
#include "lib/runtime.h"

static weft_runtime_t g_runtimes[WEFT__MAX_DEVICES];
static pthread_mutex_t g_registry = PTHREAD_MUTEX_INITIALIZER; /* rank 10 */

static bool is_runtime_handle(const weft_runtime_t *rt) {
  uintptr_t p = (uintptr_t)rt, lo = (uintptr_t)&g_runtimes[0], hi = (uintptr_t)&g_runtimes[WEFT__MAX_DEVICES];
  return p >= lo && p < hi && (p - lo) % sizeof(weft_runtime_t) == 0;
}

weft_runtime_t *weft__runtime_check(weft_runtime_t *rt, const char *fn) {
  if (rt == NULL) {
    weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: runtime is NULL", fn);
    return NULL;
  }
  if (!is_runtime_handle(rt)) {
    weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: %p is not a weft runtime", fn, (void *)rt);
    return NULL;
  }
  if (!atomic_load_explicit(&rt->alive, memory_order_acquire)) {
    weft__error(WEFT_ERR_STALE_HANDLE, "%s: the runtime of device %d was released", fn, (int)(rt - g_runtimes));
    return NULL;
  }
  return rt;
}

weft__tracker_t *weft__runtime_tracker(weft_runtime_t *rt) {
  rt = weft__runtime_check(rt, "weft");
  return rt ? &rt->tracker : NULL;
}

/* A failed runtime check says which of the two errors it recorded. */
static weft_status_t check_status(const weft_runtime_t *rt) {
  return rt == NULL || !is_runtime_handle(rt) ? WEFT_ERR_INVALID_ARGUMENT : WEFT_ERR_STALE_HANDLE;
}

weft_status_t weft__stream_check(const weft_stream_t *s, const char *fn) {
  if (s == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: stream is NULL", fn);
  weft_runtime_t *rt = s->runtime;
  if (!is_runtime_handle(rt)) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: not a weft stream", fn);
  if (!atomic_load_explicit(&rt->alive, memory_order_acquire))
    return weft__error(WEFT_ERR_STALE_HANDLE, "%s: the stream's runtime was released", fn);
  if (s->tr != &rt->tracker || s->index >= rt->tracker.n || &rt->tracker.streams[s->index] != s)
    return weft__error(WEFT_ERR_STALE_HANDLE, "%s: the stream belongs to a released runtime", fn);
  return WEFT_OK;
}

/* ---- the resource stack ------------------------------------------------------------------ */

static void destroy_stack(weft_runtime_t *rt) {
  while (rt->stack_n > 0) {
    weft_resource_t *r = rt->stack[--rt->stack_n];
    r->ops->destroy(r);
  }
  rt->top = NULL;
}

/* Builds bottom → pool → budget → guard → logging from the options. */
static weft_status_t build_stack(weft_runtime_t *rt) {
  const weft_options_t *o = &rt->opts;
  weft_resource_t *r = NULL;
  weft_status_t st;
#define PUSH(call)                          \
  do {                                      \
    if ((st = (call)) != WEFT_OK) goto fail; \
    rt->stack[rt->stack_n++] = r;           \
    rt->top = r;                            \
  } while (0)
  if (o->memory == WEFT_MEMORY_DIRECT) {
    PUSH(weft_direct_create(rt, &r));
  } else {
    weft_async_options_t ao = weft_async_options_default();
    PUSH(weft_async_create(rt, &ao, &r));
    if (o->memory == WEFT_MEMORY_POOL) {
      weft_pool_options_t po = weft_pool_options_default();
      po.chunk_bytes = o->pool_chunk_bytes;
      PUSH(weft_pool_create(rt, rt->top, &po, &r));
    }
  }
  if (o->budget_bytes != 0 || o->budget_shared_key != NULL)
    PUSH(weft_budget_create(rt, rt->top, o->budget_bytes ? o->budget_bytes : UINT64_MAX, o->budget_shared_key, &r));
  if (o->guard) {
    weft_guard_options_t go = weft_guard_options_default();
    PUSH(weft_guard_create(rt, rt->top, &go, &r));
  }
  if (o->log_path != NULL) PUSH(weft_logging_create(rt, rt->top, o->log_path, NULL, NULL, &r));
#undef PUSH
  return WEFT_OK;
fail:
  destroy_stack(rt);
  return st;
}

/* ---- lifetime ------------------------------------------------------------------------------ */

/* Frees every live block (after syncing) and the records' access arrays; records stay. */
static void free_all_blocks(weft_runtime_t *rt) {
  pthread_mutex_lock(&rt->blocks_lock);
  struct weft__block *b = rt->live;
  rt->live = NULL;
  rt->live_count = 0;
  pthread_mutex_unlock(&rt->blocks_lock);
  weft_stream_t *s0 = &rt->tracker.streams[0];
  while (b != NULL) {
    struct weft__block *next = b->next;
    if (b->kind == WEFT__BLOCK_OWNED && b->resource != NULL)
      (void)b->resource->ops->deallocate(b->resource, b->ptr, b->bytes, s0, b->tag);
    atomic_store(&b->state, WEFT__BLOCK_FREED);
    weft__block_retire(rt, b);
    b = next;
  }
}

static weft_status_t create_locked(weft_runtime_t *rt, int device, const weft_options_t *opts) {
  weft_options_t o;
  if (opts != NULL) {
    o = *opts;
  } else {
    o = weft_options_default();
    weft_status_t st = weft_options_from_env(&o);
    if (st != WEFT_OK) return st;
  }
  weft_status_t st = weft_options_validate(&o);
  if (st != WEFT_OK) return st;
  const weft__driver_t *drv;
  if ((st = weft__driver_get(&drv)) != WEFT_OK) return st;
  if (device >= drv->info.device_count)
    return weft__error(WEFT_ERR_WRONG_DEVICE, "weft_runtime_get: device %d does not exist (%d devices)", device,
                       drv->info.device_count);
  /* Keep the slot's block records (FIFO) across lives; reset everything else. */
  struct weft__block *fh = rt->free_head, *ft = rt->free_tail;
  bool had_lock = rt->drv != NULL;
  memset(&rt->opts, 0, sizeof rt->opts);
  rt->ordinal = device;
  rt->opts = o;
  if (o.log_path != NULL) {
    snprintf(rt->log_path, sizeof rt->log_path, "%s", o.log_path);
    rt->opts.log_path = rt->log_path;
  }
  if (o.budget_shared_key != NULL) {
    snprintf(rt->shared_key, sizeof rt->shared_key, "%s", o.budget_shared_key);
    rt->opts.budget_shared_key = rt->shared_key;
  }
  rt->drv = drv;
  rt->top = NULL;
  rt->stack_n = 0;
  atomic_store(&rt->allocs, 0);
  atomic_store(&rt->frees, 0);
  rt->free_head = fh;
  rt->free_tail = ft;
  rt->live = NULL;
  rt->live_count = 0;
  if (!had_lock) pthread_mutex_init(&rt->blocks_lock, NULL);
  st = weft__tracker_init(&rt->tracker, drv, device, o.stream_count, o.high_priority_streams, o.event_ring, rt);
  if (st != WEFT_OK) return st;
  /* Resources check the handle, so the runtime is alive while they are built. */
  atomic_store_explicit(&rt->alive, 1, memory_order_release);
  if ((st = build_stack(rt)) != WEFT_OK) {
    atomic_store_explicit(&rt->alive, 0, memory_order_release);
    weft__tracker_destroy(&rt->tracker);
    return st;
  }
  rt->refs = 1;
  return WEFT_OK;
}

weft_status_t weft_runtime_get(int device, const weft_options_t *opts, weft_runtime_t **out) {
  if (out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_runtime_get: out is NULL");
  if (device < 0 || device >= WEFT__MAX_DEVICES)
    return weft__error(WEFT_ERR_WRONG_DEVICE, "weft_runtime_get: device %d is out of range", device);
  weft_runtime_t *rt = &g_runtimes[device];
  weft_status_t st = WEFT_OK;
  pthread_mutex_lock(&g_registry);
  if (atomic_load(&rt->alive)) rt->refs++;
  else st = create_locked(rt, device, opts);
  pthread_mutex_unlock(&g_registry);
  if (st == WEFT_OK) *out = rt;
  return st;
}

weft_status_t weft_runtime_retain(weft_runtime_t *rt) {
  if (weft__runtime_check(rt, "weft_runtime_retain") == NULL) return check_status(rt);
  pthread_mutex_lock(&g_registry);
  weft_status_t st = WEFT_OK;
  if (atomic_load(&rt->alive)) rt->refs++;
  else st = weft__error(WEFT_ERR_STALE_HANDLE, "weft_runtime_retain: the runtime was released");
  pthread_mutex_unlock(&g_registry);
  return st;
}

/* Hook for graph/: refuse release while a capture is active, and free its state. Set by graph/
 * when it first attaches state to a runtime (graph/ sits above lib/mem, below lib). */
weft_status_t (*weft__graph_release_hook)(weft_runtime_t *rt);

weft_status_t weft_runtime_release(weft_runtime_t *rt) {
  if (weft__runtime_check(rt, "weft_runtime_release") == NULL) return check_status(rt);
  pthread_mutex_lock(&g_registry);
  if (!atomic_load(&rt->alive)) {
    pthread_mutex_unlock(&g_registry);
    return weft__error(WEFT_ERR_STALE_HANDLE, "weft_runtime_release: the runtime was already released");
  }
  if (rt->refs > 1) {
    rt->refs--;
    pthread_mutex_unlock(&g_registry);
    return WEFT_OK;
  }
  if (weft__graph_release_hook != NULL) {
    weft_status_t st = weft__graph_release_hook(rt);
    if (st != WEFT_OK) {
      pthread_mutex_unlock(&g_registry);
      return st;
    }
  }
  weft__tracker_bind(&rt->tracker);
  (void)weft__tracker_sync_all(&rt->tracker);
  free_all_blocks(rt);
  (void)weft__tracker_sync_all(&rt->tracker);
  destroy_stack(rt);
  atomic_store_explicit(&rt->alive, 0, memory_order_release);
  weft__tracker_destroy(&rt->tracker);
  rt->refs = 0;
  pthread_mutex_unlock(&g_registry);
  return WEFT_OK;
}

int weft_runtime_device(const weft_runtime_t *rt) {
  return is_runtime_handle(rt) && atomic_load(&rt->alive) ? rt->ordinal : -1;
}

weft_status_t weft_runtime_options(const weft_runtime_t *rt, weft_options_t *out) {
  if (weft__runtime_check((weft_runtime_t *)rt, "weft_runtime_options") == NULL) return check_status(rt);
  if (out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_runtime_options: out is NULL");
  *out = rt->opts;
  return WEFT_OK;
}

weft_status_t weft_runtime_synchronize(weft_runtime_t *rt) {
  if (weft__runtime_check(rt, "weft_runtime_synchronize") == NULL) return check_status(rt);
  weft_status_t st = weft__tracker_bind(&rt->tracker);
  return st != WEFT_OK ? st : weft__tracker_sync_all(&rt->tracker);
}

weft_status_t weft_runtime_counters(const weft_runtime_t *rt, weft_counters_t *out) {
  if (weft__runtime_check((weft_runtime_t *)rt, "weft_runtime_counters") == NULL) return check_status(rt);
  if (out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_runtime_counters: out is NULL");
  weft__tracker_t *tr = (weft__tracker_t *)&rt->tracker;
  pthread_mutex_lock(&tr->lock);
  *out = tr->counters;
  pthread_mutex_unlock(&tr->lock);
  out->allocs = atomic_load(&rt->allocs);
  out->frees = atomic_load(&rt->frees);
  return WEFT_OK;
}

void weft_runtime_print(const weft_runtime_t *rt, FILE *out) {
  weft_counters_t c;
  if (out == NULL || weft_runtime_counters(rt, &c) != WEFT_OK) return;
  fprintf(out, "weft runtime: device %d, %u streams (%u high priority), ring %u\n", rt->ordinal, rt->tracker.n,
          rt->tracker.n_high, rt->tracker.ring_size);
  fprintf(out, "  uses %" PRIu64 ", accesses %" PRIu64 ", waits issued %" PRIu64 ", skipped %" PRIu64
               " (host-known %" PRIu64 "), events %" PRIu64 ", ring evictions %" PRIu64 "\n",
          c.uses, c.accesses, c.waits_issued, c.waits_skipped, c.waits_host_known, c.events_recorded, c.ring_evictions);
  fprintf(out, "  allocs %" PRIu64 ", frees %" PRIu64 ", live blocks %zu\n", c.allocs, c.frees, rt->live_count);
  for (unsigned i = rt->stack_n; i-- > 0;) {
    weft_resource_stats_t s;
    rt->stack[i]->ops->stats(rt->stack[i], &s);
    fprintf(out, "  %-8s live %" PRIu64 " (peak %" PRIu64 "), reserved %" PRIu64 " (peak %" PRIu64 "), allocs %" PRIu64
                 ", frees %" PRIu64 ", failures %" PRIu64 "\n",
            rt->stack[i]->ops->name, s.live_bytes, s.live_peak, s.reserved_bytes, s.reserved_peak, s.allocs, s.frees,
            s.failures);
  }
}

weft_resource_t *weft_runtime_resource(weft_runtime_t *rt) {
  return weft__runtime_check(rt, "weft_runtime_resource") ? rt->top : NULL;
}

weft_status_t weft_runtime_set_resource(weft_runtime_t *rt, weft_resource_t *r) {
  if (weft__runtime_check(rt, "weft_runtime_set_resource") == NULL) return check_status(rt);
  if (r == NULL || r->ops == NULL || r->ops->allocate == NULL || r->ops->deallocate == NULL || r->ops->stats == NULL)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_runtime_set_resource: incomplete resource");
  weft_status_t st = WEFT_OK;
  pthread_mutex_lock(&rt->blocks_lock);
  if (rt->live_count != 0)
    st = weft__error(WEFT_ERR_BUSY, "weft_runtime_set_resource: %zu blocks are live", rt->live_count);
  else
    rt->top = r;
  pthread_mutex_unlock(&rt->blocks_lock);
  return st;
}

/* ---- streams ------------------------------------------------------------------------------- */

weft_status_t weft_stream_get(weft_runtime_t *rt, unsigned index, weft_stream_t **out) {
  if (weft__runtime_check(rt, "weft_stream_get") == NULL) return check_status(rt);
  if (out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_stream_get: out is NULL");
  if (index >= rt->tracker.n)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_stream_get: index %u >= stream_count %u", index, rt->tracker.n);
  *out = &rt->tracker.streams[index];
  return WEFT_OK;
}

weft_status_t weft_stream_next(weft_runtime_t *rt, weft_priority_t prio, weft_stream_t **out) {
  if (weft__runtime_check(rt, "weft_stream_next") == NULL) return check_status(rt);
  if (out == NULL || (prio != WEFT_PRIORITY_NORMAL && prio != WEFT_PRIORITY_HIGH))
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_stream_next: bad priority or NULL out");
  weft__tracker_t *tr = &rt->tracker;
  unsigned count = prio == WEFT_PRIORITY_HIGH ? tr->n_high : tr->n - tr->n_high;
  if (count == 0)
    return weft__error(WEFT_ERR_NOT_SUPPORTED, "weft_stream_next: the pool has no %s-priority stream",
                       prio == WEFT_PRIORITY_HIGH ? "high" : "normal");
  unsigned first = prio == WEFT_PRIORITY_HIGH ? tr->n - tr->n_high : 0;
  pthread_mutex_lock(&tr->lock);
  unsigned i = tr->rr[prio]++ % count;
  pthread_mutex_unlock(&tr->lock);
  *out = &tr->streams[first + i];
  return WEFT_OK;
}

weft_status_t weft_stream_auto(weft_runtime_t *rt, weft_priority_t prio, const weft_access_t *accesses, size_t n,
                               weft_stream_t **out) {
  if (weft__runtime_check(rt, "weft_stream_auto") == NULL) return check_status(rt);
  if (out == NULL || (prio != WEFT_PRIORITY_NORMAL && prio != WEFT_PRIORITY_HIGH))
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_stream_auto: bad priority or NULL out");
  weft__tracker_t *tr = &rt->tracker;
  if ((prio == WEFT_PRIORITY_HIGH ? tr->n_high : tr->n - tr->n_high) == 0)
    return weft__error(WEFT_ERR_NOT_SUPPORTED, "weft_stream_auto: the pool has no stream of that priority");
  weft__use_t small[16];
  weft__use_t *uses = n <= 16 ? small : weft__meta_alloc(n * sizeof *uses);
  if (uses == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_stream_auto: no host memory");
  weft_status_t st = weft__uses_from_accesses(&tr->streams[0], accesses, n, uses, "weft_stream_auto");
  if (st == WEFT_OK) *out = weft__tracker_auto(tr, prio == WEFT_PRIORITY_HIGH, uses, n);
  if (uses != small) weft__meta_free(uses);
  return st;
}

CUstream weft_stream_raw(const weft_stream_t *s) {
  if (s == NULL) return NULL;
  /* From now on code outside weft may begin a capture on it: weft watches for that. */
  atomic_store_explicit(&((weft_stream_t *)s)->exposed, true, memory_order_relaxed);
  return s->raw;
}
int weft_stream_index(const weft_stream_t *s) {
  return weft__stream_check(s, "weft_stream_index") == WEFT_OK ? (int)s->index : -1;
}
weft_runtime_t *weft_stream_runtime(const weft_stream_t *s) {
  return weft__stream_check(s, "weft_stream_runtime") == WEFT_OK ? s->runtime : NULL;
}

weft_status_t weft_stream_priority(const weft_stream_t *s, int *out) {
  weft_status_t st = weft__stream_check(s, "weft_stream_priority");
  if (st != WEFT_OK) return st;
  if (out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_stream_priority: out is NULL");
  WEFT__CU_TRY(s->tr->drv->cuStreamGetPriority(s->raw, out));
  return WEFT_OK;
}

weft_status_t weft_stream_id(const weft_stream_t *s, unsigned long long *out) {
  weft_status_t st = weft__stream_check(s, "weft_stream_id");
  if (st != WEFT_OK) return st;
  if (out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_stream_id: out is NULL");
  if (s->tr->drv->cuStreamGetId == NULL)
    return weft__error(WEFT_ERR_NOT_SUPPORTED, "weft_stream_id: the driver has no cuStreamGetId");
  WEFT__CU_TRY(s->tr->drv->cuStreamGetId(s->raw, out));
  return WEFT_OK;
}

weft_status_t weft_stream_synchronize(weft_stream_t *s) {
  weft_status_t st = weft__stream_check(s, "weft_stream_synchronize");
  return st != WEFT_OK ? st : weft__tracker_sync_stream(s);
}

weft_status_t weft_stream_query(weft_stream_t *s) {
  weft_status_t st = weft__stream_check(s, "weft_stream_query");
  return st != WEFT_OK ? st : weft__tracker_query_stream(s);
}
