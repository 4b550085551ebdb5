/* Capture sessions as the tracker sees them: a clock domain of their own, the pool streams that
 * take part (forked from the origin and rejoined before the capture ends), and the
 * capture-local history of every block touched inside, which is also the graph's access summary.
 *
 * Foreign captures (begun with cuStreamBeginCapture by code outside weft, on a pool stream or
 * on a stream a pool stream waited on) are adopted when a weft call on such a stream notices
 * them (weft__capture_sync_state), and dropped when their owner has ended them. */
#include <string.h>

#include "lib/core/debug.h"
#include "lib/core/error.h"
#include "lib/core/meta.h"
#include "streams/tracker.h"

/* Capture domains are short-lived and touch few streams: small rings, created on first use. */
#define CAPTURE_RING 32

/* Which captures this thread began in THREAD_LOCAL mode (they restrict only this thread). */
static _Thread_local unsigned tls_thread_local_captures;

bool weft__capture_blocks_housekeeping(weft__tracker_t *tr) {
  return tr->strict_captures > 0 || tls_thread_local_captures > 0;
}

static size_t hash_ptr(const void *p) {
  uint64_t x = (uint64_t)(uintptr_t)p;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (size_t)x;
}

static bool grow_index(weft__capture_t *c) {
  size_t cap = c->index_cap ? c->index_cap * 2 : 64;
  size_t *idx = weft__meta_calloc(cap, sizeof *idx);
  if (idx == NULL) return false;
  for (size_t i = 0; i < c->count; i++) {
    size_t h = hash_ptr(c->blocks[i].live) & (cap - 1);
    while (idx[h] != 0) h = (h + 1) & (cap - 1);
    idx[h] = i + 1;
  }
  weft__meta_free(c->index);
  c->index = idx;
  c->index_cap = cap;
  return true;
}

weft__capture_block_t *weft__capture_block(weft__capture_t *c, weft__access_state_t *live, bool internal) {
  if (c->index_cap != 0) {
    size_t h = hash_ptr(live) & (c->index_cap - 1);
    for (; c->index[h] != 0; h = (h + 1) & (c->index_cap - 1))
      if (c->blocks[c->index[h] - 1].live == live) return &c->blocks[c->index[h] - 1];
  }
  if ((c->count + 1) * 2 > c->index_cap && !grow_index(c)) return NULL;
  if (c->count == c->cap) {
    size_t cap = c->cap ? c->cap * 2 : 32;
    weft__capture_block_t *b = weft__meta_realloc(c->blocks, cap * sizeof *b);
    if (b == NULL) return NULL;
    /* local.reads pointed into the old array's neighbours' storage: no, each has its own. */
    c->blocks = b;
    c->cap = cap;
  }
  uint64_t *reads = weft__meta_calloc(c->dom.n, sizeof *reads);
  if (reads == NULL) return NULL;
  weft__capture_block_t *b = &c->blocks[c->count];
  memset(b, 0, sizeof *b);
  b->live = live;
  b->internal = internal;
  weft__access_init(&b->local, reads, (weft__point_t){0, 0});
  size_t h = hash_ptr(live) & (c->index_cap - 1);
  while (c->index[h] != 0) h = (h + 1) & (c->index_cap - 1);
  c->index[h] = ++c->count;
  return b;
}

static void lock(weft__tracker_t *tr) { pthread_mutex_lock(&tr->lock); }
static void unlock(weft__tracker_t *tr) { pthread_mutex_unlock(&tr->lock); }

static void count_capture(weft__capture_t *c, int delta) {
  weft__tracker_t *tr = c->tr;
  tr->captures = (unsigned)((int)tr->captures + delta);
  if (c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL) tr->strict_captures = (unsigned)((int)tr->strict_captures + delta);
  if (c->mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL && pthread_equal(c->thread, pthread_self()))
    tls_thread_local_captures = (unsigned)((int)tls_thread_local_captures + delta);
}

weft_status_t weft__capture_begin(weft_stream_t *s, CUstreamCaptureMode mode, bool foreign, uint64_t id,
                                  weft__capture_t **out) {
  weft__tracker_t *tr = s->tr;
  if (s->capture != NULL) return weft__error(WEFT_ERR_CAPTURE, "weft_capture_begin: the stream already takes part in a capture");
  weft__capture_t *c = weft__meta_calloc(1, sizeof *c);
  if (c == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_capture_begin: no host memory");
  weft_status_t st = weft__domain_init(&c->dom, tr->n, CAPTURE_RING, c);
  if (st != WEFT_OK) {
    weft__meta_free(c);
    return st;
  }
  c->tr = tr;
  c->origin = s;
  c->mode = mode;
  c->foreign = foreign;
  c->thread = pthread_self();
  c->id = id;
  if (!foreign) {
    CUresult r = tr->drv->cuStreamBeginCapture(s->raw, mode);
    if (r != CUDA_SUCCESS) {
      weft__domain_free(tr, &c->dom);
      weft__meta_free(c);
      return weft__driver_fail(r, "cuStreamBeginCapture");
    }
    if (tr->drv->cuStreamGetCaptureInfo != NULL) {
      CUstreamCaptureStatus cs;
      cuuint64_t cid = 0;
      if (tr->drv->cuStreamGetCaptureInfo(s->raw, &cs, &cid, NULL, NULL, NULL, NULL) == CUDA_SUCCESS) c->id = cid;
    }
  }
  lock(tr);
  s->capture = c;
  c->joined = 1ull << s->index;
  count_capture(c, +1);
  unlock(tr);
  *out = c;
  return WEFT_OK;
}

/* Marks s as having new work in c's domain and hands out that point, with its event recorded:
 * the fork/join points must exist even when s did nothing yet. */
static weft_status_t force_point(weft__capture_t *c, weft_stream_t *s, weft__point_t *p) {
  weft__lane_t *l = &c->dom.lane[s->index];
  weft__tracker_t *tr = c->tr;
  weft_status_t st = weft__lane_init(tr, &c->dom, l);
  if (st != WEFT_OK) return st;
  l->tick++;
  c->dom.known[(size_t)s->index * c->dom.n + s->index] = l->tick;
  unsigned slot = (unsigned)(l->tick & (c->dom.ring_size - 1));
  CUresult r = tr->drv->cuEventRecord(l->ring[slot], s->raw);
  if (r != CUDA_SUCCESS) {
    l->tick--;
    c->dom.known[(size_t)s->index * c->dom.n + s->index] = l->tick;
    return weft__driver_fail(r, "cuEventRecord");
  }
  memcpy(&l->ring_clock[(size_t)slot * c->dom.n], &c->dom.known[(size_t)s->index * c->dom.n], c->dom.n * sizeof(uint64_t));
  l->ring_tick[slot] = l->tick;
  l->recorded = l->tick;
  l->dirty = false;
  tr->counters.events_recorded++;
  *p = (weft__point_t){s->index, l->tick};
  return WEFT_OK;
}

/* `to` waits on the event of point p of stream `from` in c's domain, merging its clock. */
static weft_status_t join_on(weft__capture_t *c, weft_stream_t *to, weft_stream_t *from, weft__point_t p) {
  weft__tracker_t *tr = c->tr;
  weft__lane_t *lf = &c->dom.lane[from->index];
  unsigned slot = (unsigned)(p.tick & (c->dom.ring_size - 1));
  CUresult r = tr->drv->cuStreamWaitEvent(to->raw, lf->ring[slot], 0);
  if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuStreamWaitEvent");
  uint64_t *row = &c->dom.known[(size_t)to->index * c->dom.n];
  const uint64_t *snap = &lf->ring_clock[(size_t)slot * c->dom.n];
  for (unsigned u = 0; u < c->dom.n; u++)
    if (snap[u] > row[u]) row[u] = snap[u];
  row[to->index] = c->dom.lane[to->index].tick;
  c->dom.lane[to->index].dirty = true;
  tr->counters.waits_issued++;
  return WEFT_OK;
}

weft_status_t weft__capture_join(weft__capture_t *c, weft_stream_t *t) {
  weft__tracker_t *tr = c->tr;
  if (t->tr != tr) return weft__error(WEFT_ERR_WRONG_DEVICE, "weft_capture_join: the stream belongs to another runtime");
  lock(tr);
  weft_status_t st = WEFT_OK;
  if (t->capture == c) goto out;
  if (t->capture != NULL) {
    st = weft__error(WEFT_ERR_CAPTURE, "weft_capture_join: stream %u already takes part in another capture", t->index);
    goto out;
  }
  weft__point_t p;
  if ((st = force_point(c, c->origin, &p)) != WEFT_OK) goto out;
  t->capture = c; /* before the wait: it is the wait that pulls t into the capture */
  if ((st = join_on(c, t, c->origin, p)) != WEFT_OK) {
    t->capture = NULL;
    goto out;
  }
  c->joined |= 1ull << t->index;
out:
  unlock(tr);
  return st;
}

/* Leaves every taking-part stream out of c (lock held). */
static void detach(weft__capture_t *c) {
  weft__tracker_t *tr = c->tr;
  for (uint64_t m = c->joined; m != 0; m &= m - 1) {
    unsigned t = (unsigned)__builtin_ctzll(m);
    if (tr->streams[t].capture == c) tr->streams[t].capture = NULL;
  }
  c->joined = 0;
  count_capture(c, -1);
}

weft_status_t weft__capture_end(weft__capture_t *c, CUgraph *graph) {
  weft__tracker_t *tr = c->tr;
  *graph = NULL;
  weft_status_t st = WEFT_OK;
  lock(tr);
  /* Rejoin: the origin waits on a point of every other stream that took part. */
  for (uint64_t m = c->joined & ~(1ull << c->origin->index); m != 0 && st == WEFT_OK; m &= m - 1) {
    weft_stream_t *t = &tr->streams[__builtin_ctzll(m)];
    weft__point_t p;
    st = force_point(c, t, &p);
    if (st == WEFT_OK) st = join_on(c, c->origin, t, p);
  }
  CUgraph g = NULL;
  CUresult r = tr->drv->cuStreamEndCapture(c->origin->raw, &g);
  if (r != CUDA_SUCCESS) {
    /* The capture must end whatever happened: if the stream still captures (an invalidated
     * capture, or a failure before the driver ended it), end it again and drop its graph. */
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    if (tr->drv->cuStreamIsCapturing(c->origin->raw, &cs) == CUDA_SUCCESS && cs != CU_STREAM_CAPTURE_STATUS_NONE) {
      CUgraph dropped = NULL;
      if (tr->drv->cuStreamEndCapture(c->origin->raw, &dropped) == CUDA_SUCCESS && dropped != NULL)
        tr->drv->cuGraphDestroy(dropped);
    }
    if (g != NULL) tr->drv->cuGraphDestroy(g);
    g = NULL;
  }
  detach(c);
  unlock(tr);
  if (st != WEFT_OK) {
    if (g != NULL) tr->drv->cuGraphDestroy(g);
    return st;
  }
  if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuStreamEndCapture");
  *graph = g;
  return WEFT_OK;
}

void weft__capture_abandon(weft__capture_t *c) {
  lock(c->tr);
  detach(c);
  unlock(c->tr);
}

void weft__capture_free(weft__capture_t *c) {
  if (c == NULL) return;
  for (size_t i = 0; i < c->count; i++) weft__meta_free(c->blocks[i].local.reads);
  weft__meta_free(c->blocks);
  weft__meta_free(c->index);
  weft__domain_free(c->tr, &c->dom);
  weft__meta_free(c);
}

/* Foreign captures: the driver says s is capturing but weft has no session for it (adopt), or
 * s takes part in a foreign session that its owner has ended (abandon). weft's own sessions are
 * left alone: weft ends them itself. */
void (*weft__capture_foreign_hook)(weft__capture_t *c, bool adopted);

weft_status_t weft__capture_sync_state(weft_stream_t *s) {
  weft__tracker_t *tr = s->tr;
  if (tr->drv->cuStreamGetCaptureInfo == NULL) return WEFT_OK;
  /* Only code that had the raw stream can have begun a capture on it or forked it into one. */
  if (!atomic_load_explicit(&s->exposed, memory_order_relaxed) && (s->capture == NULL || !s->capture->foreign))
    return WEFT_OK;
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  CUresult r = tr->drv->cuStreamGetCaptureInfo(s->raw, &cs, &id, NULL, NULL, NULL, NULL);
  if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuStreamGetCaptureInfo");
  weft__capture_t *c = s->capture;
  if (cs == CU_STREAM_CAPTURE_STATUS_ACTIVE && (c == NULL || c->id != id)) {
    if (c != NULL && c->foreign) {
      /* Our record of an older foreign capture is stale. */
      weft__capture_abandon(c);
      if (weft__capture_foreign_hook) weft__capture_foreign_hook(c, false);
    } else if (c != NULL) {
      return WEFT_OK; /* weft's own capture, seen through a stream it forked */
    }
    weft__capture_t *nc;
    /* A foreign capture's mode is not visible; treat it as GLOBAL, the strictest. */
    weft_status_t st = weft__capture_begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL, true, id, &nc);
    if (st != WEFT_OK) return st;
    if (weft__capture_foreign_hook) weft__capture_foreign_hook(nc, true);
    return WEFT_OK;
  }
  if (cs != CU_STREAM_CAPTURE_STATUS_ACTIVE && c != NULL && c->foreign) {
    weft__capture_abandon(c);
    if (weft__capture_foreign_hook) weft__capture_foreign_hook(c, false);
  }
  return WEFT_OK;
}

void weft__capture_refresh(weft__tracker_t *tr) {
  uint64_t foreign = 0;
  lock(tr);
  for (unsigned i = 0; i < tr->n; i++) {
    const weft__capture_t *c = tr->streams[i].capture;
    if (c != NULL && c->foreign && c->origin == &tr->streams[i]) foreign |= 1ull << i;
  }
  unlock(tr);
  for (; foreign != 0; foreign &= foreign - 1) (void)weft__capture_sync_state(&tr->streams[__builtin_ctzll(foreign)]);
}
