/* The runtime per device: registry, reference counting, the resource stack built from options,
 * the public resource constructors, counters. */
#include <inttypes.h>
#include <string.h>

#include "lib/core/debug.h"
#include "lib/core/error.h"
#include "lib/core/handle.h"
#include "lib/core/meta.h"
#include "lib/core/trace.h"
#include "lib/runtime/runtime.h"

/* The registry. g_life guards refs and `busy` of every slot; it is never held across a driver
 * call: a slot being created or torn down is `busy`, and weft_runtime_get waits for it. */
weft_runtime_t weft__runtimes[WEFT__MAX_DEVICES]; /* runtime.h */
static bool g_busy[WEFT__MAX_DEVICES];
static pthread_mutex_t g_life = PTHREAD_MUTEX_INITIALIZER; /* rank 5 */
static pthread_cond_t g_life_cv = PTHREAD_COND_INITIALIZER;

weft_runtime_t *weft__runtime_refuse(weft_runtime_t *rt, const char *fn) {
  if (rt == NULL) {
    weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: runtime is NULL", fn);
    return NULL;
  }
  if (!weft__runtime_is_handle(rt)) {
    weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: %p is not a weft runtime", fn, (void *)rt);
    return NULL;
  }
  if (!atomic_load_explicit(&rt->alive, memory_order_acquire)) {
    weft__error(WEFT_ERR_STALE_HANDLE, "%s: the runtime of device %d was released", fn, (int)(rt - weft__runtimes));
    return NULL;
  }
  return rt;
}

weft_status_t weft__runtime_check_status(const weft_runtime_t *rt) {
  return rt == NULL || !weft__runtime_is_handle(rt) ? WEFT_ERR_INVALID_ARGUMENT : WEFT_ERR_STALE_HANDLE;
}

weft__tracker_t *weft__runtime_tracker(weft_runtime_t *rt, const char *fn, weft_status_t *st) {
  if (weft__runtime_check(rt, fn) == NULL) {
    *st = weft__runtime_check_status(rt);
    return NULL;
  }
  *st = WEFT_OK;
  return &rt->tracker;
}

void weft__runtime_depend(weft_runtime_t *rt, int delta) {
  atomic_fetch_add_explicit(&rt->dependents, (unsigned)delta, memory_order_acq_rel);
}

bool weft__runtime_list_side(weft_runtime_t *rt, weft_resource_t *r) {
  pthread_mutex_lock(&rt->blocks_lock);
  weft_resource_t **slot = weft__vec_push(&rt->side);
  if (slot != NULL) *slot = r;
  pthread_mutex_unlock(&rt->blocks_lock);
  return slot != NULL;
}

void weft__runtime_unlist_side(weft_runtime_t *rt, weft_resource_t *r) {
  pthread_mutex_lock(&rt->blocks_lock);
  weft_resource_t **all = rt->side.data;
  for (size_t i = 0; i < rt->side.len; i++)
    if (all[i] == r) {
      all[i] = all[--rt->side.len];
      break;
    }
  if (rt->side.len == 0) weft__vec_free(&rt->side); /* none left: no metadata outlives the pools */
  pthread_mutex_unlock(&rt->blocks_lock);
}

/* ---- the resource stack ------------------------------------------------------------------ */

/* Returns the first failure; every resource is destroyed regardless. */
static weft_status_t destroy_stack(weft_runtime_t *rt) {
  weft_status_t first = WEFT_OK, st;
  while (rt->stack_n > 0)
    if ((st = weft__resource_destroy(rt->stack[--rt->stack_n])) != WEFT_OK && first == WEFT_OK) first = st;
  if (rt->graph_nodes != NULL && (st = weft__resource_destroy(rt->graph_nodes)) != WEFT_OK && first == WEFT_OK) first = st;
  rt->graph_nodes = NULL;
  rt->top = NULL;
  return first;
}

/* Builds bottom → pool → budget → guard → logging from the options, and the graph memory
 * resource captures allocate from. */
static weft_status_t build_stack(weft_runtime_t *rt) {
  const weft_options_t *o = &rt->opts;
  weft__tracker_t *tr = &rt->tracker;
  weft_resource_t *r = NULL;
  weft_status_t st;
  if ((st = weft__graph_nodes_create(tr, rt, &rt->graph_nodes)) != WEFT_OK) return st;
#define PUSH(call)                          \
  do {                                      \
    if ((st = (call)) != WEFT_OK) goto fail; \
    rt->stack[rt->stack_n++] = r;           \
    rt->top = r;                            \
  } while (0)
  if (o->memory == WEFT_MEMORY_DIRECT) {
    PUSH(weft__direct_create(tr, rt, &r));
  } else {
    weft_async_options_t ao = weft_async_options_default();
    ao.release_threshold = o->release_threshold;
    PUSH(weft__async_create(tr, rt, &ao, &r));
    if (o->memory == WEFT_MEMORY_POOL) {
      weft_pool_options_t po = weft_pool_options_default();
      po.chunk_bytes = o->pool_chunk_bytes;
      PUSH(weft__pool_create(tr, rt, rt->top, &po, &r));
    }
  }
  if (o->budget_bytes != 0 || o->budget_shared_key != NULL)
    PUSH(weft__budget_create(tr, rt, rt->top, o->budget_bytes ? o->budget_bytes : UINT64_MAX, o->budget_shared_key, &r));
  if (o->guard) {
    weft_guard_options_t go = weft_guard_options_default();
    PUSH(weft__guard_create(tr, rt, rt->top, &go, &r));
  }
  if (o->log_path != NULL) PUSH(weft__logging_create(tr, rt, rt->top, o->log_path, NULL, NULL, o->log_format == 1, &r));
#undef PUSH
  return WEFT_OK;
fail:
  (void)destroy_stack(rt);
  return st;
}

/* The public constructors: resolve the runtime handle, then the resource's own (lib/mem); what
 * they make is a handle of its own (destroyed with weft_resource_destroy) the runtime waits for. */
static weft__tracker_t *creating(weft_runtime_t *rt, const void *out, const char *who, weft_status_t *st) {
  weft__tracker_t *tr = weft__runtime_tracker(rt, who, st);
  if (tr != NULL && out == NULL) {
    *st = weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: out is NULL", who);
    return NULL;
  }
  if (tr != NULL && (*st = weft__tracker_bind(tr)) != WEFT_OK) return NULL;
  return tr;
}

static weft_status_t created(weft_runtime_t *rt, weft_status_t st, weft_resource_t **out) {
  if (st != WEFT_OK) return st;
  if (!weft__handle_add(*out, WEFT__HANDLE_RESOURCE)) {
    (void)weft__resource_destroy(*out);
    return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: no host memory for a resource handle");
  }
  weft__runtime_depend(rt, +1);
  /* It draws from its upstream: that one is not destroyed under it (weft_resource_destroy). */
  weft__handle_hold((*out)->upstream, WEFT__HANDLE_RESOURCE, +1);
  return WEFT_OK;
}

weft_status_t weft_direct_create(weft_runtime_t *rt, weft_resource_t **out) {
  weft_status_t st;
  weft__tracker_t *tr = creating(rt, out, "weft_direct_create", &st);
  return tr ? created(rt, weft__direct_create(tr, rt, out), out) : st;
}

weft_status_t weft_async_create(weft_runtime_t *rt, const weft_async_options_t *opts, weft_resource_t **out) {
  weft_status_t st;
  weft__tracker_t *tr = creating(rt, out, "weft_async_create", &st);
  return tr ? created(rt, weft__async_create(tr, rt, opts, out), out) : st;
}

weft_status_t weft_pool_create(weft_runtime_t *rt, weft_resource_t *upstream, const weft_pool_options_t *opts,
                               weft_resource_t **out) {
  weft_status_t st;
  weft__tracker_t *tr = creating(rt, out, "weft_pool_create", &st);
  return tr ? created(rt, weft__pool_create(tr, rt, upstream, opts, out), out) : st;
}

weft_status_t weft_budget_create(weft_runtime_t *rt, weft_resource_t *upstream, uint64_t limit, const char *shared_key,
                                 weft_resource_t **out) {
  weft_status_t st;
  weft__tracker_t *tr = creating(rt, out, "weft_budget_create", &st);
  return tr ? created(rt, weft__budget_create(tr, rt, upstream, limit, shared_key, out), out) : st;
}

weft_status_t weft_logging_create(weft_runtime_t *rt, weft_resource_t *upstream, const char *path,
                                  weft_log_sink_fn sink, void *user, weft_resource_t **out) {
  weft_status_t st;
  weft__tracker_t *tr = creating(rt, out, "weft_logging_create", &st);
  return tr ? created(rt, weft__logging_create(tr, rt, upstream, path, sink, user, false, out), out) : st;
}

weft_status_t weft_logging_create_rmm(weft_runtime_t *rt, weft_resource_t *upstream, const char *path,
                                      weft_log_sink_fn sink, void *user, weft_resource_t **out) {
  weft_status_t st;
  weft__tracker_t *tr = creating(rt, out, "weft_logging_create_rmm", &st);
  return tr ? created(rt, weft__logging_create(tr, rt, upstream, path, sink, user, true, out), out) : st;
}

weft_status_t weft_stats_create(weft_runtime_t *rt, weft_resource_t *upstream, weft_resource_t **out) {
  weft_status_t st;
  weft__tracker_t *tr = creating(rt, out, "weft_stats_create", &st);
  return tr ? created(rt, weft__stats_create(tr, rt, upstream, out), out) : st;
}

weft_status_t weft_guard_create(weft_runtime_t *rt, weft_resource_t *upstream, const weft_guard_options_t *opts,
                                weft_resource_t **out) {
  weft_status_t st;
  weft__tracker_t *tr = creating(rt, out, "weft_guard_create", &st);
  return tr ? created(rt, weft__guard_create(tr, rt, upstream, opts, out), out) : st;
}

weft_status_t weft_resource_destroy(weft_resource_t *r) {
  static const char who[] = "weft_resource_destroy";
  if (r == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: resource is NULL", who);
  if (weft__handle_dead(r, WEFT__HANDLE_RESOURCE))
    return weft__error(WEFT_ERR_STALE_HANDLE, "%s: the resource was destroyed already", who);
  if (r->ops == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: the resource has no ops", who);
  weft_runtime_t *rt = r->rt;
  bool ours = weft__handle_live(r, WEFT__HANDLE_RESOURCE);
  /* Under blocks_lock, as weft_runtime_set_resource sets rt->top: a resource is either the
   * runtime's top or destroyed, never both. */
  bool locked = ours && weft__runtime_check(rt, who) != NULL;
  if (locked) pthread_mutex_lock(&rt->blocks_lock);
  weft_status_t refused = WEFT_OK;
  if (locked && rt->top == r)
    refused = weft__error(WEFT_ERR_BUSY, "%s: the resource backs the runtime's weft_alloc (weft_runtime_set_resource)", who);
  else if (ours)
    refused = weft__handle_unlist(r, WEFT__HANDLE_RESOURCE, who, "resource",
                                  "another resource draws from it (destroy that one first)");
  if (locked) pthread_mutex_unlock(&rt->blocks_lock);
  if (refused != WEFT_OK) return refused;
  weft_resource_t *upstream = r->upstream;
  weft_status_t st = weft__resource_destroy(r);
  if (ours) weft__runtime_depend(rt, -1);
  if (ours) weft__handle_hold(upstream, WEFT__HANDLE_RESOURCE, -1); /* r is gone either way: it draws no more */
  return st;
}

/* ---- lifetime ------------------------------------------------------------------------------ */

/* Gives every live block back to its resource (the streams were synchronised) and keeps the
 * records. Returns the first failure; every block is dealt with regardless. */
static weft_status_t free_all_blocks(weft_runtime_t *rt) {
  weft__cache_forget(rt); /* cached blocks are on the live list: freed below */
  pthread_mutex_lock(&rt->blocks_lock);
  struct weft__block *b = rt->live;
  rt->live = NULL;
  rt->live_count = 0;
  weft__map_free(&rt->by_ptr);
  pthread_mutex_unlock(&rt->blocks_lock);
  weft_stream_t *s0 = &rt->tracker.streams[0];
  weft_status_t first = WEFT_OK;
  while (b != NULL) {
    struct weft__block *next = b->next;
    if (b->resource != NULL && b->resource->ops->deallocate != NULL) {
      weft_status_t st = weft__resource_deallocate(b->resource, b->ptr, b->bytes, s0, b->tag);
      if (st != WEFT_OK && first == WEFT_OK) first = st;
    }
    weft__block_set_state(b, WEFT__BLOCK_FREED);
    weft__block_retire(b);
    b = next;
  }
  return first;
}

static weft_status_t create(weft_runtime_t *rt, int device, const weft_options_t *opts) {
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
  /* Keep the slot's block records (FIFO) and their lock across lives; reset everything else. */
  bool first_life = rt->drv == NULL;
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
  if (first_life) {
    int e = pthread_mutex_init(&rt->blocks_lock, NULL);
    if (e != 0) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_runtime_get: cannot create a lock (%s)", strerror(e));
    if ((e = pthread_mutex_init(&rt->stage_lock, NULL)) != 0) {
      pthread_mutex_destroy(&rt->blocks_lock);
      return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_runtime_get: cannot create a lock (%s)", strerror(e));
    }
    weft__cache_init(rt);
  }
  rt->drv = drv;
  rt->top = NULL;
  rt->stack_n = 0;
  atomic_store(&rt->allocs, 0);
  atomic_store(&rt->staged_copies, 0);
  atomic_store(&rt->stage_buffers, 0); /* (the last life freed them: weft__stages_free) */
  atomic_store(&rt->frees, 0);
  rt->live = NULL;
  rt->live_count = 0;
  weft__vec_free(&rt->side);
  rt->side = WEFT__VEC_INIT(weft_resource_t *);
  weft__vec_free(&rt->deferred);
  rt->deferred = WEFT__VEC_INIT(weft__deferred_t);
  atomic_store(&rt->n_deferred, 0);
  rt->oom_handler = NULL; /* a handler belongs to one life: its user data may be gone */
  rt->capture_handler = NULL;
  rt->oom_user = NULL;
  weft__map_free(&rt->by_ptr);
  rt->by_ptr_room = 0;
  unsigned adopt = o.adopt_streams < WEFT__MAX_STREAMS - o.stream_count ? o.adopt_streams : WEFT__MAX_STREAMS - o.stream_count;
  weft__trace_from_env(); /* WEFT_TRACE=path */
  st = weft__tracker_init(&rt->tracker, drv, device, o.stream_count, o.high_priority_streams, adopt, o.event_ring, rt);
  if (st != WEFT_OK) return st;
  rt->tracker.lazy = o.lazy_records != 0;
  if ((st = build_stack(rt)) != WEFT_OK) {
    (void)weft__tracker_destroy(&rt->tracker);
    return st;
  }
  /* The guard and the log must see every free: no stream cache with them. */
  rt->cache_on = o.stream_cache_bytes > 0 && !o.guard && o.log_path == NULL;
  weft__cache_forget(rt);
  static _Atomic uint64_t lives;
  rt->life = atomic_fetch_add(&lives, 1) + 1;
  for (int d = 0; d < WEFT__MAX_DEVICES; d++) atomic_store(&rt->peer_life[d], 0);
  rt->refs = 1;
  atomic_store_explicit(&rt->alive, 1, memory_order_release);
  return WEFT_OK;
}

/* Waits until no thread creates or tears down slot d (g_life held). */
static void wait_idle(int d) {
  while (g_busy[d]) pthread_cond_wait(&g_life_cv, &g_life);
}

weft_status_t weft_runtime_get(int device, const weft_options_t *opts, weft_runtime_t **out) {
  if (out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_runtime_get: out is NULL");
  if (device < 0 || device >= WEFT__MAX_DEVICES)
    return weft__error(WEFT_ERR_WRONG_DEVICE, "weft_runtime_get: device %d is out of range", device);
  weft_runtime_t *rt = &weft__runtimes[device];
  weft_status_t st = WEFT_OK;
  pthread_mutex_lock(&g_life);
  wait_idle(device);
  if (atomic_load(&rt->alive)) {
    rt->refs++;
  } else {
    g_busy[device] = true;
    pthread_mutex_unlock(&g_life);
    st = create(rt, device, opts);
    pthread_mutex_lock(&g_life);
    g_busy[device] = false;
    pthread_cond_broadcast(&g_life_cv);
  }
  pthread_mutex_unlock(&g_life);
  if (st == WEFT_OK) *out = rt;
  return st;
}

weft_status_t weft_runtime_retain(weft_runtime_t *rt) {
  if (weft__runtime_check(rt, "weft_runtime_retain") == NULL) return weft__runtime_check_status(rt);
  pthread_mutex_lock(&g_life);
  weft_status_t st = WEFT_OK;
  if (atomic_load(&rt->alive)) rt->refs++;
  else st = weft__error(WEFT_ERR_STALE_HANDLE, "weft_runtime_retain: the runtime was released");
  pthread_mutex_unlock(&g_life);
  return st;
}

/* The last reference: everything the runtime holds, in reverse order of creation. Finishes what
 * it can and returns the first failure. */
static weft_status_t teardown(weft_runtime_t *rt) {
  weft__tracker_t *tr = &rt->tracker;
  weft_status_t first = weft__tracker_bind(tr), st;
  if ((st = weft__tracker_sync_all(tr)) != WEFT_OK && first == WEFT_OK) first = st;
  weft__runtime_flush_deferred(rt); /* what can be freed on its stream; free_all_blocks takes the rest */
  if ((st = free_all_blocks(rt)) != WEFT_OK && first == WEFT_OK) first = st;
  pthread_mutex_lock(&rt->blocks_lock);
  weft__vec_free(&rt->deferred);
  atomic_store(&rt->n_deferred, 0);
  pthread_mutex_unlock(&rt->blocks_lock);
  if ((st = weft__tracker_sync_all(tr)) != WEFT_OK && first == WEFT_OK) first = st;
  if ((st = weft__stages_free(rt)) != WEFT_OK && first == WEFT_OK) first = st;
  if ((st = destroy_stack(rt)) != WEFT_OK && first == WEFT_OK) first = st;
  if ((st = weft__tracker_destroy(tr)) != WEFT_OK && first == WEFT_OK) first = st;
  return first;
}

weft_status_t weft_runtime_release(weft_runtime_t *rt) {
  if (weft__runtime_check(rt, "weft_runtime_release") == NULL) return weft__runtime_check_status(rt);
  weft__runtime_refresh_captures(rt);
  int d = (int)(rt - weft__runtimes);
  pthread_mutex_lock(&g_life);
  weft_status_t st = WEFT_OK;
  if (!atomic_load(&rt->alive)) {
    st = weft__error(WEFT_ERR_STALE_HANDLE, "weft_runtime_release: the runtime was already released");
  } else if (rt->refs > 1) {
    rt->refs--;
  } else if (atomic_load(&rt->tracker.captures) != 0) {
    /* Captures keep a runtime from being released: their streams are not free. */
    st = weft__error(WEFT_ERR_BUSY, "weft_runtime_release: %u captures are active on the runtime's streams",
                     atomic_load(&rt->tracker.captures));
  } else if (atomic_load(&rt->dependents) != 0) {
    st = weft__error(WEFT_ERR_BUSY,
                     "weft_runtime_release: %u graphs, graph pools, builders or resources made for the runtime "
                     "still exist: destroy them first",
                     atomic_load(&rt->dependents));
  } else {
    rt->refs = 0;
    atomic_store_explicit(&rt->alive, 0, memory_order_release);
    g_busy[d] = true;
    pthread_mutex_unlock(&g_life);
    st = teardown(rt);
    pthread_mutex_lock(&g_life);
    g_busy[d] = false;
    pthread_cond_broadcast(&g_life_cv);
  }
  pthread_mutex_unlock(&g_life);
  return st;
}

int weft_runtime_device(const weft_runtime_t *rt) {
  return weft__runtime_live(rt) ? rt->ordinal : -1;
}

weft_status_t weft_runtime_options(const weft_runtime_t *rt, weft_options_t *out) {
  if (weft__runtime_check((weft_runtime_t *)rt, "weft_runtime_options") == NULL) return weft__runtime_check_status(rt);
  if (out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_runtime_options: out is NULL");
  *out = rt->opts;
  return WEFT_OK;
}

weft_status_t weft_runtime_synchronize(weft_runtime_t *rt) {
  if (weft__runtime_check(rt, "weft_runtime_synchronize") == NULL) return weft__runtime_check_status(rt);
  weft_status_t st = weft__tracker_bind(&rt->tracker);
  if (st != WEFT_OK) return st;
  weft__runtime_refresh_captures(rt);
  weft__runtime_flush_deferred(rt);
  return weft__tracker_sync_all(&rt->tracker);
}

weft_status_t weft_runtime_record_pending(weft_runtime_t *rt) {
  if (weft__runtime_check(rt, "weft_runtime_record_pending") == NULL) return weft__runtime_check_status(rt);
  weft_status_t st = weft__tracker_bind(&rt->tracker);
  return st == WEFT_OK ? weft__tracker_record_pending(&rt->tracker) : st;
}

/* Grants `device` read-write access to the memory pools of rt's stack (the pool resource's
 * chunks come from them). */
static weft_status_t grant_pools(weft_runtime_t *rt, int device) {
  CUmemAccessDesc desc;
  memset(&desc, 0, sizeof desc);
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = device;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (unsigned i = 0; i < rt->stack_n; i++) {
    CUmemoryPool pool = weft_async_pool(rt->stack[i]);
    if (pool == NULL) continue;
    CUresult r;
    /* Pool attributes are housekeeping a capture must not see. */
    WEFT__RELAXED(rt->drv, r = rt->drv->cuMemPoolSetAccess(pool, &desc, 1));
    if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuMemPoolSetAccess");
  }
  return WEFT_OK;
}

weft_status_t weft__runtime_peer_ready(weft_runtime_t *rt, weft_runtime_t *peer, const char *fn) {
  if (rt == peer || atomic_load(&rt->peer_life[peer->ordinal]) == peer->life) return WEFT_OK;
  const weft__driver_t *d = rt->drv;
  if (d->cuDeviceCanAccessPeer == NULL || d->cuCtxEnablePeerAccess == NULL || d->cuMemPoolSetAccess == NULL)
    return weft__error(WEFT_ERR_NOT_SUPPORTED, "%s: the driver has no peer access", fn);
  int can = 0;
  CUresult r = d->cuDeviceCanAccessPeer(&can, rt->ordinal, peer->ordinal);
  if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuDeviceCanAccessPeer");
  if (!can)
    return weft__error(WEFT_ERR_NOT_SUPPORTED,
                       "%s: device %d cannot access device %d's memory (cuDeviceCanAccessPeer says no); copy the "
                       "block across with weft_copy_block instead",
                       fn, rt->ordinal, peer->ordinal);
  weft_status_t st = weft__tracker_bind(&rt->tracker);
  if (st != WEFT_OK) return st;
  /* One runtime per device: rt != peer is another device. */
  /* Relaxed: the first use that needs it may come inside a capture. */
  WEFT__RELAXED(d, r = d->cuCtxEnablePeerAccess(peer->tracker.ctx, 0));
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) return weft__driver_fail(r, "cuCtxEnablePeerAccess");
  /* Left enabled on failure: peer access changes no existing memory, and another call (or the
   * user) may rely on it already. */
  if ((st = grant_pools(peer, rt->ordinal)) != WEFT_OK) return st;
  atomic_store(&rt->peer_life[peer->ordinal], peer->life);
  return WEFT_OK;
}

weft_status_t weft_runtime_enable_peer_access(weft_runtime_t *rt, weft_runtime_t *peer) {
  static const char fn[] = "weft_runtime_enable_peer_access";
  if (weft__runtime_check(rt, fn) == NULL) return weft__runtime_check_status(rt);
  if (weft__runtime_check(peer, fn) == NULL) return weft__runtime_check_status(peer);
  return weft__runtime_peer_ready(rt, peer, fn);
}

weft_status_t weft_runtime_counters(const weft_runtime_t *rt, weft_counters_t *out) {
  if (weft__runtime_check((weft_runtime_t *)rt, "weft_runtime_counters") == NULL) return weft__runtime_check_status(rt);
  if (out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_runtime_counters: out is NULL");
  weft__tracker_t *tr = (weft__tracker_t *)&rt->tracker;
  weft__lock(tr->lock);
  *out = tr->counters;
  weft__unlock(tr->lock);
  /* The streams' caches count their own allocations and frees (cache.c). */
  uint64_t takes, puts;
  weft__cache_counts((weft_runtime_t *)rt, &takes, &puts, &out->cached_blocks, &out->cached_bytes);
  out->allocs = atomic_load(&rt->allocs) + takes;
  out->frees = atomic_load(&rt->frees) + puts;
  out->staged_copies = atomic_load(&rt->staged_copies);
  out->stage_buffers = atomic_load(&rt->stage_buffers);
  return WEFT_OK;
}

weft_status_t weft_runtime_trim(weft_runtime_t *rt) {
  if (weft__runtime_check(rt, "weft_runtime_trim") == NULL) return weft__runtime_check_status(rt);
  weft_status_t first = weft__cache_flush(rt, true);
  weft_status_t st = weft__resource_trim(rt->top, 0);
  return first != WEFT_OK ? first : st;
}

void weft_runtime_print(const weft_runtime_t *rt, FILE *out) {
  weft_counters_t c;
  if (out == NULL || weft_runtime_counters(rt, &c) != WEFT_OK) return;
  weft_runtime_t *mrt = (weft_runtime_t *)rt;
  pthread_mutex_lock(&mrt->blocks_lock);
  size_t live = rt->live_count;
  pthread_mutex_unlock(&mrt->blocks_lock);
  fprintf(out, "weft runtime: device %d, %u streams (%u high priority), %u adopted, ring %u\n", rt->ordinal,
          rt->tracker.n_pool, rt->tracker.n_high, atomic_load(&mrt->tracker.n_adopted), rt->tracker.ring_size);
  fprintf(out, "  uses %" PRIu64 ", accesses %" PRIu64 ", waits issued %" PRIu64 ", skipped %" PRIu64
               " (host-known %" PRIu64 "), events %" PRIu64 ", ring evictions %" PRIu64 ", late waits %" PRIu64
               ", ring growths %" PRIu64 ", busy waits %" PRIu64 "\n",
          c.uses, c.accesses, c.waits_issued, c.waits_skipped, c.waits_host_known, c.events_recorded, c.ring_evictions,
          c.late_waits, c.ring_growths, c.busy_waits);
  fprintf(out, "  allocs %" PRIu64 ", frees %" PRIu64 ", live blocks %zu (of them cached by streams %" PRIu64 ", %" PRIu64
               " bytes)\n", c.allocs, c.frees, live, c.cached_blocks, c.cached_bytes);
  fprintf(out, "  host copies staged %" PRIu64 " (page-locked buffers %" PRIu64 ")\n", c.staged_copies, c.stage_buffers);
  for (unsigned i = rt->stack_n; i-- > 0;) {
    weft_resource_stats_t s;
    weft_resource_stats(rt->stack[i], &s);
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
  static const char who[] = "weft_runtime_set_resource";
  if (weft__runtime_check(rt, who) == NULL) return weft__runtime_check_status(rt);
  if (r == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: resource is NULL", who);
  /* A destroyed resource of weft's is freed memory: told apart before anything of it is read
   * (and again under blocks_lock below, which weft_resource_destroy's check of rt->top takes). */
  if (weft__handle_dead(r, WEFT__HANDLE_RESOURCE))
    return weft__error(WEFT_ERR_STALE_HANDLE, "%s: the resource was destroyed", who);
  if (r->ops == NULL || r->ops->allocate == NULL || r->ops->deallocate == NULL)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: incomplete resource", who);
  weft_status_t st = weft__cache_flush(rt, false); /* cached blocks belong to the old resource */
  pthread_mutex_lock(&rt->blocks_lock);
  if (weft__handle_dead(r, WEFT__HANDLE_RESOURCE))
    st = weft__error(WEFT_ERR_STALE_HANDLE, "%s: the resource was destroyed", who);
  else if (rt->live_count != 0)
    st = weft__error(WEFT_ERR_BUSY, "%s: %zu blocks are live", who, rt->live_count);
  else
    rt->top = r;
  pthread_mutex_unlock(&rt->blocks_lock);
  return st;
}
