/* Page-locked staging for host copies of pageable memory (runtime.h, "staging"). */
#include <stdatomic.h>
#include <string.h>

#include "lib/core/driver.h"
#include "lib/core/error.h"
#include "lib/core/meta.h"
#include "lib/runtime/runtime.h"

struct weft__stage {
  void *host;     /* WEFT__STAGE_BYTES of cuMemHostAlloc memory */
  CUevent done;   /* recorded after the stage's last copy */
  bool used;      /* taken */
  bool in_flight; /* a host-to-device copy from it may still run (until `done`) */
  bool lost;      /* a capture begun outside weft holds its copy: never reused */
  struct weft__stage *next;
};

void *weft__stage_host(weft__stage_t *st) { return st->host; }
CUevent weft__stage_event(weft__stage_t *st) { return st->done; }

bool weft__host_pinned(const weft__driver_t *d, const void *p, size_t n) {
  if (d->cuPointerGetAttribute == NULL || n == 0) return false;
  unsigned a = 0, b = 0;
  uintptr_t first = (uintptr_t)p, last = first + n - 1;
  return d->cuPointerGetAttribute(&a, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)first) == CUDA_SUCCESS &&
         a == CU_MEMORYTYPE_HOST &&
         d->cuPointerGetAttribute(&b, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)last) == CUDA_SUCCESS &&
         b == CU_MEMORYTYPE_HOST;
}

/* A new stage (the runtime's context bound by the caller). */
static weft_status_t stage_new(weft_runtime_t *rt, weft__stage_t **out) {
  const weft__driver_t *d = rt->drv;
  if (d->cuMemHostAlloc == NULL || d->cuMemFreeHost == NULL)
    return weft__error(WEFT_ERR_NOT_SUPPORTED, "weft: the driver has no cuMemHostAlloc (host copies of pageable memory "
                                               "are staged through page-locked memory)");
  weft__stage_t *st = weft__meta_calloc(1, sizeof *st);
  if (st == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: no host memory for a staging buffer");
  CUresult r;
  WEFT__RELAXED(d, r = d->cuMemHostAlloc(&st->host, WEFT__STAGE_BYTES, 0));
  if (r != CUDA_SUCCESS) {
    weft__meta_free(st);
    return weft__driver_fail(r, "cuMemHostAlloc (a staging buffer for a host copy)");
  }
  if ((r = d->cuEventCreate(&st->done, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS) {
    WEFT__RELAXED(d, (void)d->cuMemFreeHost(st->host));
    weft__meta_free(st);
    return weft__driver_fail(r, "cuEventCreate (a staging buffer's)");
  }
  *out = st;
  return WEFT_OK;
}

weft_status_t weft__stage_take(weft_runtime_t *rt, weft__stage_t **out) {
  const weft__driver_t *d = rt->drv;
  weft__stage_t *oldest = NULL;
  unsigned count = 0;
  pthread_mutex_lock(&rt->stage_lock);
  for (weft__stage_t *x = rt->stages; x != NULL; x = x->next, count++) {
    if (x->used || x->lost) continue;
    if (x->in_flight) {
      CUresult r;
      WEFT__RELAXED(d, r = d->cuEventQuery(x->done));
      if (r == CUDA_ERROR_NOT_READY) {
        oldest = x; /* the list is newest first: the last one met is the oldest */
        continue;
      }
      x->in_flight = false; /* done (or failed: the failure is its stream's, reported there) */
    }
    x->used = true;
    pthread_mutex_unlock(&rt->stage_lock);
    *out = x;
    return WEFT_OK;
  }
  if (count >= WEFT__STAGE_MAX && oldest != NULL) {
    /* Every stage is taken or in flight: wait for the oldest copy, holding nothing. */
    oldest->used = true;
    pthread_mutex_unlock(&rt->stage_lock);
    CUresult r;
    WEFT__RELAXED(d, r = d->cuEventSynchronize(oldest->done));
    oldest->in_flight = false;
    if (r != CUDA_SUCCESS) {
      weft__stage_give(rt, oldest, false);
      return weft__driver_fail(r, "cuEventSynchronize (a staging buffer's copy)");
    }
    *out = oldest;
    return WEFT_OK;
  }
  pthread_mutex_unlock(&rt->stage_lock);
  weft__stage_t *fresh;
  weft_status_t st = weft__tracker_bind(&rt->tracker); /* (cuMemHostAlloc needs the context) */
  if (st == WEFT_OK) st = stage_new(rt, &fresh);
  if (st != WEFT_OK) return st;
  fresh->used = true;
  atomic_fetch_add(&rt->stage_buffers, 1);
  pthread_mutex_lock(&rt->stage_lock);
  fresh->next = rt->stages;
  rt->stages = fresh;
  pthread_mutex_unlock(&rt->stage_lock);
  *out = fresh;
  return WEFT_OK;
}

void weft__stage_give(weft_runtime_t *rt, weft__stage_t *st, bool in_flight) {
  pthread_mutex_lock(&rt->stage_lock);
  st->in_flight = in_flight;
  st->used = false;
  pthread_mutex_unlock(&rt->stage_lock);
}

void weft__stage_lose(weft_runtime_t *rt, weft__stage_t *st) {
  pthread_mutex_lock(&rt->stage_lock);
  st->lost = true;
  st->used = false;
  pthread_mutex_unlock(&rt->stage_lock);
}

weft_status_t weft__stages_free(weft_runtime_t *rt) {
  const weft__driver_t *d = rt->drv;
  weft_status_t first = WEFT_OK;
  pthread_mutex_lock(&rt->stage_lock);
  weft__stage_t *x = rt->stages;
  rt->stages = NULL;
  pthread_mutex_unlock(&rt->stage_lock);
  while (x != NULL) {
    weft__stage_t *next = x->next;
    CUresult r;
    /* (The runtime's streams are synchronised: a copy still in flight has failed.) */
    WEFT__RELAXED(d, r = d->cuMemFreeHost(x->host));
    if (r != CUDA_SUCCESS && first == WEFT_OK) first = weft__driver_fail(r, "cuMemFreeHost (a staging buffer)");
    if ((r = d->cuEventDestroy(x->done)) != CUDA_SUCCESS && first == WEFT_OK)
      first = weft__driver_fail(r, "cuEventDestroy (a staging buffer's)");
    weft__meta_free(x);
    atomic_fetch_sub(&rt->stage_buffers, 1);
    x = next;
  }
  return first;
}
