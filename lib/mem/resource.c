/* The resource interface: every call into a resource, with the counting every resource shares
 * (as RMM keeps counting out of its resources, weft keeps it in the dispatch; the pool keeps its
 * own under its lock: mem.h), the checked public calls, and the helpers the built-in resources
 * share (mem.h).
 *
 * Counts are updated with relaxed atomics: each is exact, and a reader sees each on its own
 * (live bytes and the call counts may be a call apart when read while calls run). */
#include <string.h>

#include "lib/mem/mem.h"

static void count_live(weft_resource_counts_t *c, uint64_t bytes) {
  uint64_t live = __atomic_add_fetch(&c->live_bytes, bytes, __ATOMIC_RELAXED);
  uint64_t peak = __atomic_load_n(&c->live_peak, __ATOMIC_RELAXED);
  while (live > peak && !__atomic_compare_exchange_n(&c->live_peak, &peak, live, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  __atomic_add_fetch(&c->allocs, 1, __ATOMIC_RELAXED);
}

/* weft__resource_allocate's body, also inline in the public call (a call less on the pair). */
static inline __attribute__((always_inline)) weft_status_t resource_allocate(weft_resource_t *r, size_t bytes,
                                                                             weft_stream_t *s, const char *tag,
                                                                             CUdeviceptr *out) {
  weft_status_t st = r->ops->allocate(r, bytes, s, tag, out);
  if (st != WEFT_OK) __atomic_add_fetch(&r->counts.failures, 1, __ATOMIC_RELAXED);
  else if (!weft__resource_counts_itself(r)) count_live(&r->counts, bytes);
  return st;
}

weft_status_t weft__resource_allocate(weft_resource_t *r, size_t bytes, weft_stream_t *s, const char *tag,
                                      CUdeviceptr *out) {
  return resource_allocate(r, bytes, s, tag, out);
}

/* weft__resource_deallocate's body, also inline in the public call. */
static inline __attribute__((always_inline)) weft_status_t resource_deallocate(weft_resource_t *r, CUdeviceptr p,
                                                                               size_t bytes, weft_stream_t *s,
                                                                               const char *tag) {
  if (weft__resource_counts_itself(r)) {
    /* Counted inside the call, under the resource's lock (it checks the pointer and size). */
    weft_status_t st = r->ops->deallocate(r, p, bytes, s, tag);
    if (st != WEFT_OK) __atomic_add_fetch(&r->counts.failures, 1, __ATOMIC_RELAXED);
    return st;
  }
  /* Counted before the call: once a free succeeds, the resource's owner may destroy it (a graph
   * whose last output was freed), so nothing may touch it afterwards. A failure undoes it. */
  /* More bytes than are live cannot be a block of this resource (a double free, a wrong size):
   * nothing is subtracted, and the resource says what is wrong. (A concurrent free of a wrong
   * pointer, itself an error, may make a right one take this path: it still succeeds, and the
   * counts are off by that block.) */
  uint64_t live = __atomic_load_n(&r->counts.live_bytes, __ATOMIC_RELAXED);
  do {
    if (live < bytes) {
      __atomic_add_fetch(&r->counts.failures, 1, __ATOMIC_RELAXED);
      return r->ops->deallocate(r, p, bytes, s, tag);
    }
  } while (!__atomic_compare_exchange_n(&r->counts.live_bytes, &live, live - bytes, true, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED));
  __atomic_add_fetch(&r->counts.frees, 1, __ATOMIC_RELAXED);
  weft_status_t st = r->ops->deallocate(r, p, bytes, s, tag);
  /* CORRUPTED: freed, but the memory around the block was damaged (the guard's report). */
  if (st != WEFT_OK && st != WEFT_ERR_CORRUPTED) {
    __atomic_add_fetch(&r->counts.live_bytes, bytes, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&r->counts.frees, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&r->counts.failures, 1, __ATOMIC_RELAXED);
  }
  return st;
}

weft_status_t weft__resource_deallocate(weft_resource_t *r, CUdeviceptr p, size_t bytes, weft_stream_t *s,
                                        const char *tag) {
  return resource_deallocate(r, p, bytes, s, tag);
}

void weft__resource_adopt(weft_resource_t *r, uint64_t bytes) {
  if (weft__resource_counts_itself(r)) weft__pool_recount(r, bytes, true);
  else count_live(&r->counts, bytes);
}

void weft__resource_disown(weft_resource_t *r, uint64_t bytes) {
  if (weft__resource_counts_itself(r)) {
    weft__pool_recount(r, bytes, false);
    return;
  }
  WEFT_ASSERT_INTERNAL(__atomic_load_n(&r->counts.live_bytes, __ATOMIC_RELAXED) >= bytes);
  __atomic_sub_fetch(&r->counts.live_bytes, bytes, __ATOMIC_RELAXED);
  __atomic_add_fetch(&r->counts.frees, 1, __ATOMIC_RELAXED);
}

weft_status_t weft__resource_trim(weft_resource_t *r, size_t keep) {
  if (r->ops->trim != NULL) return r->ops->trim(r, keep);
  return r->upstream != NULL ? weft__resource_trim(r->upstream, keep) : WEFT_OK;
}

/* ---- helpers ----------------------------------------------------------------------------------- */

weft_status_t weft__plain_resource_create(weft__tracker_t *tr, weft_runtime_t *rt, const weft_resource_ops_t *ops,
                                          weft_resource_t **out) {
  weft__plain_resource_t *p = weft__meta_calloc(1, sizeof *p);
  if (p == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: no host memory for resource '%s'", ops->name);
  weft__resource_init(&p->base, ops, NULL, rt);
  p->tr = tr;
  *out = &p->base;
  return WEFT_OK;
}

weft_status_t weft__plain_resource_destroy(weft_resource_t *r) {
  weft__meta_free(r);
  return WEFT_OK;
}

weft_status_t weft__mem_check_bytes(const char *who, size_t bytes) {
  if (bytes == 0) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: bytes is 0", who);
  if ((uint64_t)bytes > WEFT__MEM_MAX_BYTES)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: bytes is %zu, more than the 2^48 bytes any resource accepts",
                       who, bytes);
  return WEFT_OK;
}

weft_status_t weft__mem_check_upstream(const char *who, weft_runtime_t *rt, const weft_resource_t *up) {
  if (up == NULL || up->ops == NULL || up->ops->allocate == NULL || up->ops->deallocate == NULL)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: upstream is NULL or has no allocate/deallocate", who);
  if (up->rt != NULL && up->rt != rt)
    return weft__error(WEFT_ERR_WRONG_DEVICE, "%s: upstream '%s' serves another runtime", who,
                       up->ops->name ? up->ops->name : "?");
  return WEFT_OK;
}

weft_status_t weft__mem_lock_init(pthread_mutex_t *m, const char *who) {
  int e = pthread_mutex_init(m, NULL);
  if (e != 0) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "%s: pthread_mutex_init failed: %s", who, strerror(e));
  return WEFT_OK;
}

/* ---- checked public calls ---------------------------------------------------------------------- */

/* Why a checked call's arguments are refused (the cold side of call_ok). */
static __attribute__((noinline)) weft_status_t check_call(const char *who, const weft_resource_t *r, bool alloc, weft_stream_t *s, size_t bytes) {
  if (r == NULL || r->ops == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: resource is NULL", who);
  if ((alloc ? (void *)r->ops->allocate : (void *)r->ops->deallocate) == NULL)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: resource '%s' has no %s", who, r->ops->name ? r->ops->name : "?",
                       alloc ? "allocate" : "deallocate");
  if (s == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: stream is NULL", who);
  if (r->rt != NULL && s->runtime != (void *)r->rt)
    return weft__error(WEFT_ERR_WRONG_DEVICE, "%s: stream %u belongs to another runtime than resource '%s'", who,
                       s->index, r->ops->name ? r->ops->name : "?");
  /* Resources serve live streams; inside a capture weft_alloc allocates graph memory. */
  if (weft__tracker_in_capture(s))
    return weft__error(WEFT_ERR_CAPTURE, "%s: stream %u takes part in a capture (use weft_alloc inside captures)", who,
                       s->index);
  return weft__mem_check_bytes(who, bytes);
}

/* Whether a checked call's arguments pass every check of check_call (the hot side, inline). */
static inline bool call_ok(const weft_resource_t *r, bool alloc, weft_stream_t *s, size_t bytes) {
  return r != NULL && r->ops != NULL && (alloc ? (void *)r->ops->allocate : (void *)r->ops->deallocate) != NULL &&
         s != NULL && (r->rt == NULL || s->runtime == (void *)r->rt) && !weft__tracker_in_capture(s) && bytes != 0 &&
         (uint64_t)bytes <= WEFT__MEM_MAX_BYTES;
}

weft_status_t weft_resource_allocate(weft_resource_t *r, size_t bytes, weft_stream_t *s, const char *tag,
                                     CUdeviceptr *out) {
  static const char who[] = "weft_resource_allocate";
  if (__builtin_expect(!call_ok(r, true, s, bytes), 0)) return check_call(who, r, true, s, bytes);
  if (out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: out is NULL", who);
  return resource_allocate(r, bytes, s, tag ? tag : "", out);
}

weft_status_t weft_resource_deallocate(weft_resource_t *r, CUdeviceptr p, size_t bytes, weft_stream_t *s,
                                       const char *tag) {
  static const char who[] = "weft_resource_deallocate";
  if (__builtin_expect(!call_ok(r, false, s, bytes), 0)) return check_call(who, r, false, s, bytes);
  if (p == 0) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: pointer is 0", who);
  return resource_deallocate(r, p, bytes, s, tag ? tag : "");
}

void weft_resource_stats(const weft_resource_t *r, weft_resource_stats_t *out) {
  if (out == NULL) return;
  memset(out, 0, sizeof *out);
  if (r == NULL || r->ops == NULL) return;
  const weft_resource_counts_t *c = &r->counts;
  out->live_bytes = __atomic_load_n(&c->live_bytes, __ATOMIC_RELAXED);
  out->live_peak = __atomic_load_n(&c->live_peak, __ATOMIC_RELAXED);
  out->allocs = __atomic_load_n(&c->allocs, __ATOMIC_RELAXED);
  out->frees = __atomic_load_n(&c->frees, __ATOMIC_RELAXED);
  out->failures = __atomic_load_n(&c->failures, __ATOMIC_RELAXED);
  out->reserved_bytes = out->live_bytes;
  out->reserved_peak = out->live_peak;
  if (r->ops->stats != NULL) r->ops->stats(r, out);
}

weft_status_t weft_resource_trim(weft_resource_t *r, size_t keep) {
  if (r == NULL || r->ops == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_resource_trim: resource is NULL");
  return weft__resource_trim(r, keep);
}

weft_status_t weft__resource_destroy(weft_resource_t *r) {
  return r->ops->destroy != NULL ? r->ops->destroy(r) : WEFT_OK;
}
