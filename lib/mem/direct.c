/* The direct resource: cuMemAlloc / cuMemFree. A free first synchronises the freeing stream (the
 * caller already made it wait for every use), because cuMemFree is not stream-ordered. Slow; for
 * debugging and as the simplest upstream. */
#include "lib/mem/mem.h"

typedef struct direct {
  weft_resource_t base;     /* first */
  pthread_mutex_t lock;     /* rank 20; guards st */
  weft__tracker_t *tr;
  weft_resource_stats_t st; /* reserved == live: every byte comes straight from the driver */
} direct_t;

static weft_status_t direct_allocate(weft_resource_t *self, size_t bytes, weft_stream_t *s, const char *tag,
                                     CUdeviceptr *out) {
  direct_t *d = (direct_t *)self;
  weft_status_t st = weft__mem_check_stream("direct allocate", d->tr, s);
  CUdeviceptr p = 0;
  if (st == WEFT_OK) st = weft__tracker_bind(d->tr);
  if (st == WEFT_OK) {
    CUresult r = d->tr->drv->cuMemAlloc(&p, bytes);
    if (r != CUDA_SUCCESS) st = weft__driver_fail(r, "cuMemAlloc");
  }
  pthread_mutex_lock(&d->lock);
  if (st == WEFT_OK) {
    weft__rstats_live(&d->st, bytes);
    weft__rstats_reserve(&d->st, bytes);
  } else {
    d->st.failures++;
  }
  pthread_mutex_unlock(&d->lock);
  if (st == WEFT_OK) *out = p;
  return st;
}

static weft_status_t direct_deallocate(weft_resource_t *self, CUdeviceptr p, size_t bytes, weft_stream_t *s,
                                       const char *tag) {
  direct_t *d = (direct_t *)self;
  weft_status_t st = weft__mem_check_stream("direct deallocate", d->tr, s);
  if (st == WEFT_OK) st = weft__tracker_bind(d->tr);
  if (st == WEFT_OK) {
    CUresult r = d->tr->drv->cuStreamSynchronize(s->raw);
    if (r != CUDA_SUCCESS) st = weft__driver_fail(r, "cuStreamSynchronize (before cuMemFree)");
  }
  if (st == WEFT_OK) {
    CUresult r = d->tr->drv->cuMemFree(p);
    if (r != CUDA_SUCCESS) st = weft__driver_fail(r, "cuMemFree");
  }
  pthread_mutex_lock(&d->lock);
  if (st == WEFT_OK) {
    weft__rstats_unlive(&d->st, bytes);
    weft__rstats_unreserve(&d->st, bytes);
  } else {
    d->st.failures++;
  }
  pthread_mutex_unlock(&d->lock);
  return st;
}

static void direct_stats(const weft_resource_t *self, weft_resource_stats_t *out) {
  direct_t *d = (direct_t *)self;
  pthread_mutex_lock(&d->lock);
  *out = d->st;
  pthread_mutex_unlock(&d->lock);
}

static void direct_destroy(weft_resource_t *self) {
  direct_t *d = (direct_t *)self;
  pthread_mutex_destroy(&d->lock);
  weft__meta_free(d);
}

const weft_resource_ops_t weft__direct_ops = {
    .name = "direct",
    .allocate = direct_allocate,
    .deallocate = direct_deallocate,
    .stats = direct_stats,
    .trim = NULL,
    .destroy = direct_destroy,
};

weft_status_t weft_direct_create(weft_runtime_t *rt, weft_resource_t **out) {
  static const char who[] = "weft_direct_create";
  weft_status_t st;
  weft__tracker_t *tr = weft__mem_tracker(who, rt, &st);
  if (tr == NULL) return st;
  if (out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: out is NULL", who);
  direct_t *d = weft__meta_calloc(1, sizeof *d);
  if (d == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "%s: no host memory", who);
  if ((st = weft__mem_lock_init(&d->lock, who)) != WEFT_OK) {
    weft__meta_free(d);
    return st;
  }
  d->base.ops = &weft__direct_ops;
  d->base.rt = rt;
  d->tr = tr;
  *out = &d->base;
  return WEFT_OK;
}
