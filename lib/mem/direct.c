/* The direct resource: cuMemAlloc / cuMemFree. A free first synchronises the freeing stream (the
 * caller already made it wait for every use), because cuMemFree is not stream-ordered. Slow; for
 * debugging and as the simplest upstream. Holds nothing of its own: reserved == live. */
#include "lib/mem/mem.h"

typedef weft__plain_resource_t direct_t;

static weft_status_t direct_allocate(weft_resource_t *self, size_t bytes, weft_stream_t *s, const char *tag,
                                     CUdeviceptr *out) {
  direct_t *d = (direct_t *)self;
  weft_status_t st = weft__tracker_bind(d->tr);
  if (st != WEFT_OK) return st;
  CUresult r;
  WEFT__RELAXED(d->tr->drv, r = d->tr->drv->cuMemAlloc(out, bytes));
  return r == CUDA_SUCCESS ? WEFT_OK : weft__driver_fail(r, "cuMemAlloc");
}

static weft_status_t direct_deallocate(weft_resource_t *self, CUdeviceptr p, size_t bytes, weft_stream_t *s,
                                       const char *tag) {
  direct_t *d = (direct_t *)self;
  weft_status_t st = weft__tracker_bind(d->tr);
  if (st != WEFT_OK) return st;
  if ((st = weft__tracker_hold(s, "direct deallocate")) != WEFT_OK) return st;
  CUresult r, f = CUDA_ERROR_UNKNOWN;
  WEFT__RELAXED(d->tr->drv, if ((r = d->tr->drv->cuStreamSynchronize(s->raw)) == CUDA_SUCCESS) f = d->tr->drv->cuMemFree(p));
  weft__tracker_unhold(s);
  if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuStreamSynchronize (before cuMemFree)");
  return f == CUDA_SUCCESS ? WEFT_OK : weft__driver_fail(f, "cuMemFree");
}

const weft_resource_ops_t weft__direct_ops = {
    .name = "direct",
    .allocate = direct_allocate,
    .deallocate = direct_deallocate,
    .destroy = weft__plain_resource_destroy,
};

weft_status_t weft__direct_create(weft__tracker_t *tr, weft_runtime_t *rt, weft_resource_t **out) {
  return weft__plain_resource_create(tr, rt, &weft__direct_ops, out);
}
