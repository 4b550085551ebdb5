/* Graph pools: device memory reserved for graphs captured with WEFT_GRAPH_MEMORY_PRIVATE_POOL.
 *
 * Addresses handed out during a capture are baked into the graph, so the memory stays with the
 * pool until the pool is destroyed. Within one capture, a range freed and handed out again keeps
 * the free's point: the tracker makes the new block's first use wait for it, inside the capture.
 * When the capture ends its points settle to "complete": graphs that share a pool must replay in
 * the order they were captured (as with PyTorch's graph pools), so a later graph may use the
 * memory without waiting. Chunks come from cuMemAlloc with the thread's capture mode exchanged to
 * RELAXED for that call (cuMemAlloc is unsafe under GLOBAL capture otherwise). */
#include <string.h>

#include "graph/graph.h"
#include "lib/core/error.h"
#include "lib/core/meta.h"

#define GRAIN 256u
#define MIN_CHUNK ((size_t)2 << 20)

weft_status_t weft__gpool_new(weft_runtime_t *rt, weft_graph_pool_t **out) {
  weft_graph_pool_t *p = weft__meta_calloc(1, sizeof *p);
  if (p == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_graph_pool_create: no host memory");
  p->rt = rt;
  pthread_mutex_init(&p->lock, NULL);
  *out = p;
  return WEFT_OK;
}

static bool push_free(weft_graph_pool_t *p, weft__grange_t r) {
  if (p->n_free == p->cap_free) {
    size_t cap = p->cap_free ? p->cap_free * 2 : 32;
    weft__grange_t *f = weft__meta_realloc(p->free, cap * sizeof *f);
    if (f == NULL) return false;
    p->free = f;
    p->cap_free = cap;
  }
  p->free[p->n_free++] = r;
  return true;
}

weft_status_t weft__gpool_alloc(weft_graph_pool_t *p, size_t bytes, const void *domain, CUdeviceptr *ptr,
                                weft__point_t *point) {
  size_t need = (bytes + GRAIN - 1) / GRAIN * GRAIN;
  weft_status_t st = WEFT_OK;
  pthread_mutex_lock(&p->lock);
  /* Best fit among ranges usable by this capture (settled ones or its own frees). */
  size_t best = SIZE_MAX;
  for (size_t i = 0; i < p->n_free; i++) {
    const weft__grange_t *r = &p->free[i];
    if (r->bytes < need || (r->domain != NULL && r->domain != domain)) continue;
    if (best == SIZE_MAX || r->bytes < p->free[best].bytes) best = i;
  }
  if (best == SIZE_MAX) {
    size_t chunk = need > MIN_CHUNK ? need : MIN_CHUNK;
    CUdeviceptr base = 0;
    const weft__driver_t *drv = p->rt->drv;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    drv->cuThreadExchangeStreamCaptureMode(&mode);
    CUresult r = drv->cuMemAlloc(&base, chunk);
    drv->cuThreadExchangeStreamCaptureMode(&mode);
    CUdeviceptr *c = r == CUDA_SUCCESS ? weft__meta_realloc(p->chunks, (p->n_chunks + 1) * sizeof *c) : NULL;
    size_t *cb = c ? weft__meta_realloc(p->chunk_bytes, (p->n_chunks + 1) * sizeof *cb) : NULL;
    if (c) p->chunks = c;
    if (cb) p->chunk_bytes = cb;
    if (r != CUDA_SUCCESS) {
      st = weft__driver_fail(r, "cuMemAlloc (graph pool chunk)");
    } else if (c == NULL || cb == NULL || !push_free(p, (weft__grange_t){base, chunk, {0, 0}, NULL})) {
      drv->cuMemFree(base);
      st = weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "graph pool: no host memory");
    } else {
      p->chunks[p->n_chunks] = base;
      p->chunk_bytes[p->n_chunks++] = chunk;
      p->reserved += chunk;
      best = p->n_free - 1;
    }
  }
  if (st == WEFT_OK) {
    weft__grange_t *r = &p->free[best];
    *ptr = r->ptr;
    *point = r->domain == domain ? r->point : (weft__point_t){0, 0};
    if (r->bytes == need) {
      p->free[best] = p->free[--p->n_free];
    } else {
      r->ptr += need;
      r->bytes -= need;
    }
  }
  pthread_mutex_unlock(&p->lock);
  return st;
}

weft_status_t weft__gpool_free(weft_graph_pool_t *p, CUdeviceptr ptr, size_t bytes, const void *domain, weft__point_t point) {
  size_t need = (bytes + GRAIN - 1) / GRAIN * GRAIN;
  pthread_mutex_lock(&p->lock);
  bool ok = push_free(p, (weft__grange_t){ptr, need, point, domain});
  pthread_mutex_unlock(&p->lock);
  return ok ? WEFT_OK : weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "graph pool: no host memory");
}

void weft__gpool_settle(weft_graph_pool_t *p, const void *domain) {
  pthread_mutex_lock(&p->lock);
  for (size_t i = 0; i < p->n_free; i++)
    if (p->free[i].domain == domain) {
      p->free[i].domain = NULL;
      p->free[i].point = (weft__point_t){0, 0};
    }
  pthread_mutex_unlock(&p->lock);
}

weft_status_t weft_graph_pool_create(weft_runtime_t *rt, weft_graph_pool_t **out) {
  if (weft__runtime_check(rt, "weft_graph_pool_create") == NULL) return weft_runtime_device(rt) < 0 && rt ? WEFT_ERR_STALE_HANDLE : WEFT_ERR_INVALID_ARGUMENT;
  if (out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_graph_pool_create: out is NULL");
  return weft__gpool_new(rt, out);
}

uint64_t weft_graph_pool_reserved(const weft_graph_pool_t *p) { return p ? p->reserved : 0; }

weft_status_t weft_graph_pool_destroy(weft_graph_pool_t *p) {
  if (p == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_graph_pool_destroy: pool is NULL");
  if (p->users != 0) return weft__error(WEFT_ERR_BUSY, "weft_graph_pool_destroy: %u graphs still use the pool", p->users);
  if (p->n_chunks != 0 && atomic_load(&p->rt->alive)) {
    weft__tracker_bind(&p->rt->tracker);
    (void)weft__tracker_sync_all(&p->rt->tracker);
    for (size_t i = 0; i < p->n_chunks; i++) p->rt->drv->cuMemFree(p->chunks[i]);
  }
  weft__meta_free(p->chunks);
  weft__meta_free(p->chunk_bytes);
  weft__meta_free(p->free);
  pthread_mutex_destroy(&p->lock);
  weft__meta_free(p);
  return WEFT_OK;
}
