/* Graph pools: device memory for graphs captured with WEFT_GRAPH_MEMORY_PRIVATE_POOL, as a
 * resource the capture hands weft_alloc (graph.h). lib/mem's TLSF core places the ranges, with
 * splitting and coalescing.
 *
 * Addresses handed out during a capture are baked into the graph, so the memory stays with the
 * pool until the pool is destroyed. Within one capture, a range freed on stream t and handed out
 * again on stream s makes s wait (inside the capture) for the free's point first, as weft's pool
 * does for live streams; on t itself stream order suffices. When the capture ends its ranges
 * become free for anyone: graphs that share a pool must replay in the order they were captured
 * (as with PyTorch's graph pools), and weft orders their launches one after another whatever
 * streams they run on (each launch writes the pool's `acc`). Chunks come from cuMemAlloc in RELAXED capture mode
 * (cuMemAlloc is unsafe under capture otherwise). */
#include <string.h>

#include "graph/graph.h"
#include "lib/core/error.h"
#include "lib/core/meta.h"

#define MIN_CHUNK ((uint64_t)2 << 20)

typedef struct weft__gchunk {
  CUdeviceptr base;
  uint64_t bytes;
} weft__gchunk_t;

/* A new chunk able to hold n bytes, in the idle lane. Locked. */
static weft_status_t grow(weft_graph_pool_t *p, uint64_t n, weft__tlsf_range_t **out) {
  uint64_t bytes = n > MIN_CHUNK ? n : MIN_CHUNK;
  if (!weft__vec_reserve(&p->chunks, 1)) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "graph pool: no host memory");
  const weft__driver_t *drv = p->tr->drv;
  CUdeviceptr base = 0;
  CUresult r;
  WEFT__RELAXED(drv, r = drv->cuMemAlloc(&base, bytes));
  if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuMemAlloc (graph pool chunk)");
  weft__tlsf_range_t *range = weft__tlsf_add_chunk(&p->tlsf, base, bytes, NULL, p->idle, 0);
  if (range == NULL) {
    WEFT__RELAXED(drv, drv->cuMemFree(base));
    return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "graph pool: no host memory");
  }
  *(weft__gchunk_t *)weft__vec_push(&p->chunks) = (weft__gchunk_t){base, bytes};
  weft__mem_reserve(&p->reserved, &p->reserved_peak, bytes);
  *out = range;
  return WEFT_OK;
}

static weft_status_t gpool_allocate(weft_resource_t *self, size_t bytes, weft_stream_t *s, const char *tag,
                                    CUdeviceptr *out) {
  weft_graph_pool_t *p = (weft_graph_pool_t *)self;
  /* As in lib/mem/pool.c: only a pile of adaptors could ask beyond the largest size class. */
  if ((uint64_t)bytes > WEFT__TLSF_MAX_BYTES - WEFT__TLSF_GRANULE)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "graph pool: %zu bytes is beyond the largest size class", bytes);
  uint64_t n = weft__tlsf_round_up(bytes);
  weft_status_t st = WEFT_OK;
  pthread_mutex_lock(&p->lock);
  if (p->active == NULL || weft__tracker_capture_of(s, NULL) != p->active) {
    pthread_mutex_unlock(&p->lock);
    return weft__error(WEFT_ERR_CAPTURE, "graph pool: allocations come only from the capture drawing from the pool");
  }
  /* The smallest fit among stream s's own frees, ranges free for anyone and other streams'
   * frees (those after a wait inside the capture): graph memory stays reserved until the pool
   * goes, so memory counts for more than an edge in the graph. Ties go to no wait. */
  weft__tlsf_range_t *r = NULL;
  unsigned from = s->index;
  for (unsigned k = 0; k < p->idle + 2; k++) {
    unsigned lane = k == 0 ? s->index : k == 1 ? p->idle : k - 2;
    if (k >= 2 && (lane == s->index || lane >= p->idle)) continue;
    weft__tlsf_range_t *c = weft__tlsf_find(&p->tlsf, lane, n);
    if (c != NULL && (r == NULL || c->size < r->size)) {
      r = c;
      from = lane;
    }
  }
  if (r != NULL && from != s->index && from != p->idle) st = weft__tracker_order(s, (weft__point_t){from, r->stamp});
  if (r == NULL && st == WEFT_OK) st = grow(p, n, &r);
  weft__tlsf_range_t *a = r != NULL && st == WEFT_OK ? weft__tlsf_alloc(&p->tlsf, r, n) : NULL;
  if (st == WEFT_OK && r != NULL && a == NULL) st = weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "graph pool: no host memory");
  WEFT_ASSERT_EXPENSIVE(weft__tlsf_is_valid(&p->tlsf));
  pthread_mutex_unlock(&p->lock);
  if (a != NULL) *out = a->addr;
  return st;
}

static weft_status_t gpool_deallocate(weft_resource_t *self, CUdeviceptr ptr, size_t bytes, weft_stream_t *s,
                                      const char *tag) {
  weft_graph_pool_t *p = (weft_graph_pool_t *)self;
  pthread_mutex_lock(&p->lock);
  weft__tlsf_range_t *r = weft__tlsf_lookup(&p->tlsf, ptr);
  if (r == NULL || r->size != weft__tlsf_round_up(bytes) || p->active == NULL) {
    pthread_mutex_unlock(&p->lock);
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "graph pool: 0x%llx is not a range of the active capture",
                       (unsigned long long)ptr);
  }
  weft__point_t at = weft__tracker_point(s);
  weft__tlsf_free(&p->tlsf, r, at.tick == 0 ? p->idle : s->index, at.tick);
  WEFT_ASSERT_EXPENSIVE(weft__tlsf_is_valid(&p->tlsf));
  pthread_mutex_unlock(&p->lock);
  return WEFT_OK;
}

static void gpool_stats(const weft_resource_t *self, weft_resource_stats_t *out) {
  weft_graph_pool_t *p = (weft_graph_pool_t *)self;
  pthread_mutex_lock(&p->lock);
  out->reserved_bytes = p->reserved;
  out->reserved_peak = p->reserved_peak;
  pthread_mutex_unlock(&p->lock);
}

/* Its chunks, and the free ranges in them (those of a capture in progress on their lanes). */
static void gpool_segments(const weft_resource_t *self, void (*segment)(void *ctx, const weft_segment_t *s),
                           void (*free_range)(void *ctx, const weft_free_range_t *r), void *ctx) {
  weft_graph_pool_t *p = (weft_graph_pool_t *)self;
  pthread_mutex_lock(&p->lock);
  for (size_t i = 0; i < p->chunks.len; i++) {
    const weft__gchunk_t *c = &WEFT__VEC_AT(&p->chunks, weft__gchunk_t, i);
    weft_segment_t sg = {c->base, c->bytes, 0};
    segment(ctx, &sg);
  }
  weft__tlsf_free_ranges(&p->tlsf, p->idle + 1, free_range, ctx);
  pthread_mutex_unlock(&p->lock);
}

const weft_resource_ops_t weft__gpool_ops = {
    .name = "graph pool",
    .allocate = gpool_allocate,
    .deallocate = gpool_deallocate,
    .stats = gpool_stats,
    .segments = gpool_segments,
};

weft_status_t weft__gpool_new(weft__tracker_t *tr, weft_runtime_t *rt, weft_graph_pool_t **out) {
  weft_graph_pool_t *p = weft__meta_calloc(1, sizeof *p);
  unsigned lanes = weft__tracker_lanes();
  uint64_t *reads = NULL;
  if (p != NULL && (reads = weft__meta_calloc(lanes, sizeof *reads)) == NULL) {
    weft__meta_free(p);
    p = NULL;
  }
  if (p == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_graph_pool_create: no host memory");
  weft_status_t st = weft__tlsf_init(&p->tlsf, tr->n + 1);
  if (st == WEFT_OK && (st = weft__mem_lock_init(&p->lock, "weft_graph_pool_create")) != WEFT_OK)
    weft__tlsf_destroy(&p->tlsf);
  if (st != WEFT_OK) {
    weft__meta_free(reads);
    weft__meta_free(p);
    return st;
  }
  weft__access_init(&p->acc, reads, lanes);
  weft__resource_init(&p->base, &weft__gpool_ops, NULL, rt);
  p->tr = tr;
  p->idle = tr->n;
  p->chunks = WEFT__VEC_INIT(weft__gchunk_t);
  if (!weft__runtime_list_side(rt, &p->base)) {
    pthread_mutex_destroy(&p->lock);
    weft__tlsf_destroy(&p->tlsf);
    weft__meta_free(p->acc.reads);
    weft__meta_free(p);
    return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_graph_pool_create: no host memory");
  }
  if (!weft__handle_add(p, WEFT__HANDLE_GRAPH_POOL)) {
    weft__runtime_unlist_side(rt, &p->base);
    pthread_mutex_destroy(&p->lock);
    weft__tlsf_destroy(&p->tlsf);
    weft__meta_free(p->acc.reads);
    weft__meta_free(p);
    return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_graph_pool_create: no host memory for a handle");
  }
  weft__runtime_depend(rt, +1);
  *out = p;
  return WEFT_OK;
}

weft_graph_pool_t *weft__gpool_of(weft_resource_t *alloc_to) {
  return alloc_to != NULL && alloc_to->ops == &weft__gpool_ops ? (weft_graph_pool_t *)alloc_to : NULL;
}

weft_status_t weft__gpool_attach(weft_graph_pool_t *p, weft__capture_t *c) {
  weft_status_t st = WEFT_OK;
  pthread_mutex_lock(&p->lock);
  if (p->doomed)
    st = weft__error(WEFT_ERR_INVALID_ARGUMENT,
                     "weft_capture_begin: the graph pool's destroy failed part way; destroy it again");
  else if (p->active != NULL && p->active != c)
    st = weft__error(WEFT_ERR_BUSY, "weft_capture_begin: another capture is drawing from the graph pool");
  else {
    p->active = c;
    p->users++;
  }
  pthread_mutex_unlock(&p->lock);
  return st;
}

void weft__gpool_detach(weft_graph_pool_t *p, weft__capture_t *c, bool made) {
  pthread_mutex_lock(&p->lock);
  if (!made) {
    /* No graph: what the capture allocated and kept comes back. */
    for (size_t i = 0; i < c->blocks.len; i++) {
      const weft__capture_block_t *b = &WEFT__VEC_AT(&c->blocks, weft__capture_block_t, i);
      if (!b->internal || b->freed) continue;
      const struct weft__block *rec = WEFT__BLOCK_OF(b->live);
      weft__tlsf_range_t *r = rec->resource == &p->base ? weft__tlsf_lookup(&p->tlsf, rec->ptr) : NULL;
      if (r != NULL) weft__tlsf_free(&p->tlsf, r, p->idle, 0);
    }
  }
  for (unsigned t = 0; t < p->idle; t++) {
    weft__tlsf_range_t *r;
    while ((r = weft__tlsf_oldest(&p->tlsf, t)) != NULL) weft__tlsf_move(&p->tlsf, r, p->idle, 0);
  }
  if (p->active == c) p->active = NULL;
  WEFT_ASSERT_EXPENSIVE(weft__tlsf_is_valid(&p->tlsf));
  pthread_mutex_unlock(&p->lock);
}

weft_status_t weft__gpool_use(weft_graph_pool_t *p, weft_runtime_t *rt, const char *fn) {
  /* Inside p until the use is taken; from then on the use keeps it (weft_graph_pool_destroy says
   * BUSY while p has users, also after its removal: a use taken while it waited for us counts). */
  weft_status_t st = weft__graph_enter(p, WEFT__HANDLE_GRAPH_POOL, fn);
  if (st != WEFT_OK) return st;
  if (p->base.rt != rt) {
    st = weft__error(WEFT_ERR_WRONG_DEVICE, "%s: the graph pool belongs to another runtime", fn);
  } else {
    pthread_mutex_lock(&p->lock);
    p->users++;
    pthread_mutex_unlock(&p->lock);
  }
  weft__handle_leave();
  return st;
}

weft_status_t weft__gpool_unuse(weft_graph_pool_t *p) {
  pthread_mutex_lock(&p->lock);
  bool last = --p->users == 0 && p->implicit;
  pthread_mutex_unlock(&p->lock);
  return last ? weft_graph_pool_destroy(p) : WEFT_OK;
}

weft_status_t weft_graph_pool_create(weft_runtime_t *rt, weft_graph_pool_t **out) {
  weft_status_t st;
  weft__tracker_t *tr = weft__runtime_tracker(rt, "weft_graph_pool_create", &st);
  if (tr == NULL) return st;
  if (out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_graph_pool_create: out is NULL");
  return weft__gpool_new(tr, rt, out);
}

/* The queries read p inside it (weft__graph_enter): a concurrent weft_graph_pool_destroy waits. */
int weft_graph_pool_owns(const weft_graph_pool_t *p, CUdeviceptr ptr) {
  if (weft__graph_enter(p, WEFT__HANDLE_GRAPH_POOL, "weft_graph_pool_owns") != WEFT_OK) return 0;
  pthread_mutex_lock((pthread_mutex_t *)&p->lock);
  bool owns = false;
  for (size_t i = 0; i < p->chunks.len && !owns; i++) {
    const weft__gchunk_t *c = &WEFT__VEC_AT(&p->chunks, weft__gchunk_t, i);
    owns = ptr >= c->base && ptr - c->base < c->bytes;
  }
  pthread_mutex_unlock((pthread_mutex_t *)&p->lock);
  weft__handle_leave();
  return owns;
}

uint64_t weft_graph_pool_reserved(const weft_graph_pool_t *p) {
  if (weft__graph_enter(p, WEFT__HANDLE_GRAPH_POOL, "weft_graph_pool_reserved") != WEFT_OK) return 0;
  pthread_mutex_lock((pthread_mutex_t *)&p->lock);
  uint64_t r = p->reserved;
  pthread_mutex_unlock((pthread_mutex_t *)&p->lock);
  weft__handle_leave();
  return r;
}

/* BUSY while graphs or captures use graph pool p (also captures being begun: weft__gpool_use). */
static weft_status_t pool_busy(void *v) {
  weft_graph_pool_t *p = v;
  pthread_mutex_lock(&p->lock);
  unsigned users = p->users;
  pthread_mutex_unlock(&p->lock);
  if (users != 0) return weft__error(WEFT_ERR_BUSY, "weft_graph_pool_destroy: %u graphs or captures use the pool", users);
  return WEFT_OK;
}

weft_status_t weft_graph_pool_destroy(weft_graph_pool_t *p) {
  weft_status_t first = weft__graph_remove(p, WEFT__HANDLE_GRAPH_POOL, "weft_graph_pool_destroy", pool_busy);
  if (first != WEFT_OK) return first;
  weft_runtime_t *rt = p->base.rt;
  if (p->chunks.len != 0) {
    /* Launches may still run on the memory: the last launch that wrote it (every launch of a
     * graph drawing from the pool writes `acc`) finishes first. Chunks are freed last first
     * (ranges graphs kept are only records now: no graph uses the pool). On a failure the pool
     * stays with the chunks not yet freed, doomed (no capture may draw from it: its records
     * still name freed chunks), and a retry frees the rest. */
    weft__point_t pts[WEFT__MAX_LANES + 1];
    size_t n = weft__tracker_conflicts(p->tr, &p->acc, WEFT_WRITE, pts);
    if ((first = weft__tracker_bind(p->tr)) == WEFT_OK) first = weft__tracker_sync_points(p->tr, pts, n);
    pthread_mutex_lock(&p->lock);
    bool freed_any = false;
    while (first == WEFT_OK && p->chunks.len != 0) {
      const weft__gchunk_t c = WEFT__VEC_AT(&p->chunks, weft__gchunk_t, p->chunks.len - 1);
      CUresult cr;
      WEFT__RELAXED(p->tr->drv, cr = p->tr->drv->cuMemFree(c.base));
      if (cr != CUDA_SUCCESS) {
        first = weft__driver_fail(cr, "cuMemFree (graph pool chunk)");
        p->doomed = p->doomed || freed_any; /* a failure on the first changes nothing */
        break;
      }
      freed_any = true;
      p->reserved -= c.bytes;
      p->chunks.len--;
    }
    pthread_mutex_unlock(&p->lock);
    if (first != WEFT_OK) {
      weft__handle_restore(p, WEFT__HANDLE_GRAPH_POOL);
      return first;
    }
  }
  weft__runtime_unlist_side(rt, &p->base);
  weft__runtime_depend(rt, -1);
  weft__vec_free(&p->chunks);
  weft__tlsf_destroy(&p->tlsf);
  pthread_mutex_destroy(&p->lock);
  weft__meta_free(p->acc.reads);
  weft__meta_free(p);
  return first;
}
