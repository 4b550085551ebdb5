/* The stream pool: the device's primary context, N non-blocking streams with priorities, and the
 * live domain's clocks and event rings. Creation unwinds in reverse order on any failure
 * (libuv's ladder). */
#include <string.h>

#include "lib/core/debug.h"
#include "lib/core/error.h"
#include "lib/core/meta.h"
#include "streams/tracker.h"

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
static void reset(weft__tracker_t *tr) {
  weft_stream_t keep[WEFT__MAX_STREAMS];
  memcpy(keep, tr->streams, sizeof keep);
  memset(tr, 0, sizeof *tr);
  for (unsigned i = 0; i < WEFT__MAX_STREAMS; i++) {
    tr->streams[i].tr = keep[i].tr;
    tr->streams[i].runtime = keep[i].runtime;
    tr->streams[i].index = keep[i].index;
  }
}

weft_status_t weft__tracker_init(weft__tracker_t *tr, const weft__driver_t *drv, int ordinal, unsigned n,
                                 unsigned n_high, unsigned ring_size, void *runtime) {
  WEFT_ASSERT(n >= 1 && n <= WEFT__MAX_STREAMS && n_high <= n);
  WEFT_ASSERT(ring_size >= 2 && (ring_size & (ring_size - 1)) == 0);
  reset(tr);
  tr->drv = drv;
  tr->ordinal = ordinal;
  tr->n = n;
  tr->n_high = n_high;
  tr->ring_size = ring_size;
  weft_status_t st;
  CUresult r;
  unsigned made = 0;
  if ((r = drv->cuDeviceGet(&tr->device, ordinal)) != CUDA_SUCCESS) {
    weft__driver_fail(r, "cuDeviceGet");
    return weft__error(WEFT_ERR_WRONG_DEVICE, "weft: device %d does not exist (%s)", ordinal,
                       weft_driver_error_name(r));
  }
  if ((r = drv->cuDevicePrimaryCtxRetain(&tr->ctx, tr->device)) != CUDA_SUCCESS)
    return weft__driver_fail(r, "cuDevicePrimaryCtxRetain");
  if ((st = weft__tracker_bind(tr)) != WEFT_OK) goto fail_ctx;
  int least = 0, greatest = 0, ops64 = 0;
  if ((r = drv->cuCtxGetStreamPriorityRange(&least, &greatest)) != CUDA_SUCCESS) {
    st = weft__driver_fail(r, "cuCtxGetStreamPriorityRange");
    goto fail_ctx;
  }
  if (drv->cuDeviceGetAttribute(&ops64, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, tr->device) == CUDA_SUCCESS)
    tr->mem_ops64 = ops64 != 0;
  if ((st = weft__domain_init(&tr->live, n, ring_size, NULL)) != WEFT_OK) goto fail_ctx;
  for (; made < n; made++) {
    weft_stream_t *s = &tr->streams[made];
    bool high = made >= n - n_high;
    s->tr = tr;
    s->runtime = runtime;
    s->index = made;
    s->high = high;
    s->priority = high ? greatest : least;
    s->last_used = 0;
    s->capture = NULL;
    if ((r = drv->cuStreamCreateWithPriority(&s->raw, CU_STREAM_NON_BLOCKING, s->priority)) != CUDA_SUCCESS) {
      s->raw = NULL;
      st = weft__driver_fail(r, "cuStreamCreateWithPriority");
      goto fail_streams;
    }
    /* Live rings up front: a use never fails for want of an event. */
    if ((st = weft__lane_init(tr, &tr->live, &tr->live.lane[made])) != WEFT_OK) {
      drv->cuStreamDestroy(s->raw);
      s->raw = NULL;
      goto fail_streams;
    }
  }
  if (pthread_mutex_init(&tr->lock, NULL) != 0) {
    st = weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: cannot create the tracker lock");
    goto fail_streams;
  }
  return WEFT_OK;

fail_streams:
  while (made-- > 0) {
    drv->cuStreamDestroy(tr->streams[made].raw);
    tr->streams[made].raw = NULL;
  }
  weft__domain_free(tr, &tr->live);
fail_ctx:
  drv->cuDevicePrimaryCtxRelease(tr->device);
  reset(tr);
  return st;
}

void weft__tracker_destroy(weft__tracker_t *tr) {
  if (tr->live.known == NULL) return;
  weft__tracker_bind(tr);
  for (unsigned i = 0; i < tr->n; i++) tr->drv->cuStreamSynchronize(tr->streams[i].raw);
  weft__domain_free(tr, &tr->live);
  for (unsigned i = 0; i < tr->n; i++) tr->drv->cuStreamDestroy(tr->streams[i].raw);
  tr->drv->cuDevicePrimaryCtxRelease(tr->device);
  pthread_mutex_destroy(&tr->lock);
  reset(tr);
}
