/* The stream pool: the device's primary context, N non-blocking streams with priorities, and the
 * per-stream event rings. Creation unwinds in reverse order on any failure (libuv's ladder). */
#include <string.h>

#include "lib/core/debug.h"
#include "lib/core/error.h"
#include "lib/core/meta.h"
#include "streams/tracker.h"

/* The context the calling thread last bound, so that binding is free when nothing changed. */
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

static void destroy_stream(weft__tracker_t *tr, weft_stream_t *s) {
  if (s->ring != NULL) {
    for (unsigned i = 0; i < tr->ring_size; i++)
      if (s->ring[i] != NULL) tr->drv->cuEventDestroy(s->ring[i]);
  }
  if (s->raw != NULL) tr->drv->cuStreamDestroy(s->raw);
  weft__meta_free(s->ring);
  weft__meta_free(s->ring_tick);
  weft__meta_free(s->ring_clock);
  /* Keep the identity (tr, runtime, index) so that a stale handle is recognised as one. */
  weft__tracker_t *tr_keep = s->tr;
  void *rt_keep = s->runtime;
  unsigned index = s->index;
  memset(s, 0, sizeof *s);
  s->tr = tr_keep;
  s->runtime = rt_keep;
  s->index = index;
}

static weft_status_t create_stream(weft__tracker_t *tr, weft_stream_t *s, unsigned index, bool high, int prio,
                                   void *runtime) {
  memset(s, 0, sizeof *s);
  s->tr = tr;
  s->runtime = runtime;
  s->index = index;
  s->high = high;
  s->priority = prio;
  s->ring = weft__meta_calloc(tr->ring_size, sizeof *s->ring);
  s->ring_tick = weft__meta_calloc(tr->ring_size, sizeof *s->ring_tick);
  s->ring_clock = weft__meta_calloc((size_t)tr->ring_size * tr->n, sizeof *s->ring_clock);
  if (s->ring == NULL || s->ring_tick == NULL || s->ring_clock == NULL) {
    destroy_stream(tr, s);
    return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: no host memory for a stream's event ring");
  }
  CUresult r = tr->drv->cuStreamCreateWithPriority(&s->raw, CU_STREAM_NON_BLOCKING, prio);
  if (r != CUDA_SUCCESS) {
    s->raw = NULL;
    destroy_stream(tr, s);
    return weft__driver_fail(r, "cuStreamCreateWithPriority");
  }
  for (unsigned i = 0; i < tr->ring_size; i++) {
    r = tr->drv->cuEventCreate(&s->ring[i], CU_EVENT_DISABLE_TIMING);
    if (r != CUDA_SUCCESS) {
      s->ring[i] = NULL;
      destroy_stream(tr, s);
      return weft__driver_fail(r, "cuEventCreate");
    }
  }
  return WEFT_OK;
}

/* Clears everything but the embedded streams' identities. */
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
  if ((r = drv->cuDeviceGet(&tr->device, ordinal)) != CUDA_SUCCESS) {
    weft__driver_fail(r, "cuDeviceGet");
    return weft__error(WEFT_ERR_WRONG_DEVICE, "weft: device %d does not exist (%s)", ordinal,
                       weft_driver_error_name(r));
  }
  if ((r = drv->cuDevicePrimaryCtxRetain(&tr->ctx, tr->device)) != CUDA_SUCCESS)
    return weft__driver_fail(r, "cuDevicePrimaryCtxRetain");
  if ((st = weft__tracker_bind(tr)) != WEFT_OK) goto fail_ctx;
  int least = 0, greatest = 0;
  if ((r = drv->cuCtxGetStreamPriorityRange(&least, &greatest)) != CUDA_SUCCESS) {
    st = weft__driver_fail(r, "cuCtxGetStreamPriorityRange");
    goto fail_ctx;
  }
  int ops64 = 0;
  if (drv->cuDeviceGetAttribute(&ops64, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, tr->device) == CUDA_SUCCESS)
    tr->mem_ops64 = ops64 != 0;
  tr->known = weft__meta_calloc((size_t)n * n, sizeof *tr->known);
  tr->host_known = weft__meta_calloc(n, sizeof *tr->host_known);
  if (tr->known == NULL || tr->host_known == NULL) {
    st = weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: no host memory for the stream pool");
    goto fail_arrays;
  }
  unsigned made = 0;
  for (; made < n; made++) {
    bool high = made >= n - n_high;
    st = create_stream(tr, &tr->streams[made], made, high, high ? greatest : least, runtime);
    if (st != WEFT_OK) goto fail_streams;
  }
  if (pthread_mutex_init(&tr->lock, NULL) != 0) {
    st = weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: cannot create the tracker lock");
    goto fail_streams;
  }
  return WEFT_OK;

fail_streams:
  while (made-- > 0) destroy_stream(tr, &tr->streams[made]);
fail_arrays:
  weft__meta_free(tr->known);
  weft__meta_free(tr->host_known);
fail_ctx:
  drv->cuDevicePrimaryCtxRelease(tr->device);
  reset(tr);
  return st;
}

void weft__tracker_destroy(weft__tracker_t *tr) {
  if (tr->known == NULL) return;
  weft__tracker_bind(tr);
  for (unsigned i = 0; i < tr->n; i++) {
    tr->drv->cuStreamSynchronize(tr->streams[i].raw);
    destroy_stream(tr, &tr->streams[i]);
  }
  weft__meta_free(tr->known);
  weft__meta_free(tr->host_known);
  tr->drv->cuDevicePrimaryCtxRelease(tr->device);
  pthread_mutex_destroy(&tr->lock);
  reset(tr);
}
