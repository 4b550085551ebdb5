/* The resource interface: checked calls through a weft_resource_t's ops, and the helpers the
 * built-in resources share (mem.h). Argument checks live here so that every resource, built-in or
 * user-written, sees only well-formed calls: bytes in 1..2^48, a stream, a non-NULL tag. */
#include <string.h>

#include "lib/mem/mem.h"

weft_status_t weft__mem_check_bytes(const char *who, size_t bytes) {
  if (bytes == 0) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: bytes is 0", who);
  if ((uint64_t)bytes > WEFT__MEM_MAX_BYTES)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: bytes is %zu, more than the 2^48 bytes any resource accepts",
                       who, bytes);
  return WEFT_OK;
}

weft__tracker_t *weft__mem_tracker(const char *who, weft_runtime_t *rt, weft_status_t *status) {
  if (rt == NULL) {
    *status = weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: runtime is NULL", who);
    return NULL;
  }
  weft__tracker_t *tr = weft__runtime_tracker(rt);
  if (tr == NULL) {
    *status = weft__error(WEFT_ERR_STALE_HANDLE, "%s: the runtime was released", who);
    return NULL;
  }
  *status = WEFT_OK;
  return tr;
}

weft_status_t weft__mem_check_stream(const char *who, const weft__tracker_t *tr, const weft_stream_t *s) {
  if (s == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: stream is NULL", who);
  if (s->tr != tr)
    return weft__error(WEFT_ERR_WRONG_DEVICE, "%s: stream %u belongs to another runtime than the resource", who,
                       s->index);
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

weft_status_t weft__mem_check_no_capture(const char *who, weft__tracker_t *tr) {
  for (unsigned i = 0; i < tr->n; i++) {
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult r = tr->drv->cuStreamIsCapturing(tr->streams[i].raw, &cs);
    if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuStreamIsCapturing");
    if (cs != CU_STREAM_CAPTURE_STATUS_NONE)
      return weft__error(WEFT_ERR_CAPTURE, "%s: stream %u is capturing; pool housekeeping would be seen by the capture",
                         who, i);
  }
  return WEFT_OK;
}

/* ---- checked calls --------------------------------------------------------------------- */

static weft_status_t check_resource(const char *who, const weft_resource_t *r) {
  if (r == NULL || r->ops == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: resource is NULL", who);
  return WEFT_OK;
}

weft_status_t weft_resource_allocate(weft_resource_t *r, size_t bytes, weft_stream_t *s, const char *tag,
                                     CUdeviceptr *out) {
  weft_status_t st = check_resource("weft_resource_allocate", r);
  if (st != WEFT_OK) return st;
  if (r->ops->allocate == NULL)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_resource_allocate: resource '%s' has no allocate", r->ops->name);
  if (out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_resource_allocate: out is NULL");
  if (s == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_resource_allocate: stream is NULL");
  if ((st = weft__mem_check_bytes("weft_resource_allocate", bytes)) != WEFT_OK) return st;
  return r->ops->allocate(r, bytes, s, tag ? tag : "", out);
}

weft_status_t weft_resource_deallocate(weft_resource_t *r, CUdeviceptr p, size_t bytes, weft_stream_t *s,
                                       const char *tag) {
  weft_status_t st = check_resource("weft_resource_deallocate", r);
  if (st != WEFT_OK) return st;
  if (r->ops->deallocate == NULL)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_resource_deallocate: resource '%s' has no deallocate",
                       r->ops->name);
  if (p == 0) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_resource_deallocate: pointer is 0");
  if (s == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_resource_deallocate: stream is NULL");
  if ((st = weft__mem_check_bytes("weft_resource_deallocate", bytes)) != WEFT_OK) return st;
  return r->ops->deallocate(r, p, bytes, s, tag ? tag : "");
}

void weft_resource_stats(const weft_resource_t *r, weft_resource_stats_t *out) {
  if (out == NULL) return;
  memset(out, 0, sizeof *out);
  if (r != NULL && r->ops != NULL && r->ops->stats != NULL) r->ops->stats(r, out);
}

weft_status_t weft_resource_trim(weft_resource_t *r, size_t keep) {
  weft_status_t st = check_resource("weft_resource_trim", r);
  if (st != WEFT_OK) return st;
  return r->ops->trim ? r->ops->trim(r, keep) : WEFT_OK;
}

void weft_resource_destroy(weft_resource_t *r) {
  if (r != NULL && r->ops != NULL && r->ops->destroy != NULL) r->ops->destroy(r);
}
