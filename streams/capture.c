/* Capture sessions as the tracker sees them: a clock domain of their own, the pool streams that
 * take part (forked from the origin and rejoined before the capture ends, with the clock's own
 * record and wait), and the capture-local history of every block touched inside, which is also
 * the graph's access summary and outputs.
 *
 * Foreign captures (begun with cuStreamBeginCapture by code outside weft) are adopted and
 * dropped by the runtime (lib/runtime), which asks weft__capture_probe() what the driver says. */
#include <string.h>

#include "lib/core/debug.h"
#include "lib/core/error.h"
#include "lib/core/meta.h"
#include "streams/clock.h"

/* Capture domains are short-lived and touch few streams: small rings, created on first use. */
#define CAPTURE_RING 32

weft__capture_block_t *weft__capture_find(const weft__capture_t *c, const weft__access_state_t *live) {
  const uint64_t *i = weft__map_find(&c->index, (uint64_t)(uintptr_t)live);
  return i != NULL ? &WEFT__VEC_AT(&c->blocks, weft__capture_block_t, *i - 1) : NULL;
}

weft__capture_block_t *weft__capture_block(weft__capture_t *c, weft__access_state_t *live, bool internal) {
  weft__capture_block_t *b = weft__capture_find(c, live);
  if (b != NULL) return b;
  uint64_t *reads = weft__meta_calloc(c->dom.n, sizeof *reads);
  if (reads == NULL || !weft__map_reserve(&c->index, 1) || !weft__vec_reserve(&c->blocks, 1)) {
    weft__meta_free(reads);
    return NULL;
  }
  b = weft__vec_push(&c->blocks);
  b->live = live;
  b->internal = internal;
  weft__access_init(&b->local, reads, c->dom.n);
  *weft__map_insert(&c->index, (uint64_t)(uintptr_t)live, NULL) = c->blocks.len;
  return b;
}

static void lock(weft__tracker_t *tr) { weft__lock(tr->lock); }
static void unlock(weft__tracker_t *tr) { weft__unlock(tr->lock); }

/* Waits (lock held, released meanwhile) until no host wait holds s and no use of s is enqueuing
 * its work (tracker.h, "Busy lanes"): s may then start capturing. */
static void wait_free(weft__tracker_t *tr, weft_stream_t *s) {
  for (;;) {
    if (s->holds != 0) weft__cond_wait(&tr->unheld, tr->lock);
    else if (weft__lanes_atomic_has(&tr->live->busy, s->lane)) weft__clock_idle_wait(tr, weft__lane_bit(s->lane));
    else return;
  }
}

static void count_capture(weft__capture_t *c, int delta) {
  atomic_fetch_add_explicit(&c->tr->captures, (unsigned)delta, memory_order_release);
}

/* The foreign capture with driver id `id` that a stream of tr takes part in, or NULL (lock held). */
static weft__capture_t *foreign_by_id(weft__tracker_t *tr, uint64_t id) {
  for (unsigned i = 0; i < tr->n && weft__tracker_lane_used(tr, i); i++) {
    weft__capture_t *o = tr->streams[i].capture;
    if (o != NULL && o->foreign && o->id == id) return o;
  }
  return NULL;
}

weft_status_t weft__capture_begin(weft_stream_t *s, CUstreamCaptureMode mode, bool foreign, uint64_t id,
                                  weft_resource_t *alloc_to, weft__capture_t **out, bool *ended) {
  weft__tracker_t *tr = s->tr;
  if (ended != NULL) *ended = false;
  WEFT_ASSERT(alloc_to != NULL);
  weft__capture_t *c = weft__meta_calloc(1, sizeof *c);
  if (c == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_capture_begin: no host memory");
  c->tr = tr;
  weft_status_t st = weft__domain_init(&c->dom, tr->n, CAPTURE_RING, c);
  if (st != WEFT_OK) {
    weft__meta_free(c);
    return st;
  }
  c->origin = s;
  c->mode = mode;
  c->foreign = foreign;
  c->thread = pthread_self();
  c->id = id;
  c->alloc_to = alloc_to;
  c->trace_us = weft__trace_on() ? weft__trace_now_us() : 0;
  c->blocks = WEFT__VEC_INIT(weft__capture_block_t);
  lock(tr);
  wait_free(tr, s); /* host waits on s and its use enqueuing finish first */
  weft__capture_t *joined = NULL;
  bool active;
  uint64_t now;
  if (s->capture != NULL) {
    st = weft__error(WEFT_ERR_CAPTURE, "weft_capture_begin: stream %u already takes part in a capture", s->index);
  } else if (foreign && ((st = weft__capture_probe(s, &active, &now)) != WEFT_OK || !active || now != id)) {
    if (st == WEFT_OK) *ended = true; /* its owner ended it since the caller looked: nothing to adopt */
  } else if (foreign && (joined = foreign_by_id(tr, id)) != NULL) {
    /* Forked onto s from a stream weft met the capture on already: the same capture. */
    s->capture = joined;
    joined->joined |= 1ull << s->index;
  } else if (!foreign) {
    /* The live pending event must be recorded before the stream starts capturing, or it would
     * be captured instead. */
    st = weft__clock_flush(tr, tr->live, s);
    CUresult r = st == WEFT_OK ? tr->drv->cuStreamBeginCapture(s->raw, mode) : CUDA_SUCCESS;
    if (r != CUDA_SUCCESS) st = weft__driver_fail(r, "cuStreamBeginCapture");
    bool on;
    uint64_t cid;
    if (st == WEFT_OK && weft__capture_probe(s, &on, &cid) == WEFT_OK) c->id = cid;
  }
  bool installed = st == WEFT_OK && joined == NULL && (ended == NULL || !*ended);
  if (installed) {
    s->capture = c;
    c->joined = 1ull << s->index;
    count_capture(c, +1);
  }
  unlock(tr);
  if (!installed) { /* (failed, joined, or ended) */
    weft__capture_free(c);
    *out = NULL;
    return st;
  }
  *out = c;
  return WEFT_OK;
}

/* The weft capture whose origin is s, or NULL (lock held). */
static weft__capture_t *own_capture(weft_stream_t *s) {
  weft__capture_t *c = s->capture;
  return c != NULL && c->origin == s && !c->foreign ? c : NULL;
}

weft_status_t weft__capture_join(weft_stream_t *origin, weft_stream_t *t) {
  weft__tracker_t *tr = origin->tr;
  if (t->tr != tr) return weft__error(WEFT_ERR_WRONG_DEVICE, "weft_capture_join: the stream belongs to another runtime");
  lock(tr);
  weft_status_t st = WEFT_OK;
  uint64_t fork;
  weft__capture_t *c = own_capture(origin);
  if (c == NULL) {
    st = weft__error(WEFT_ERR_CAPTURE, "weft_capture_join: stream %u is not the origin of a weft capture", origin->index);
    goto out;
  }
  wait_free(tr, t); /* host waits on t and its use enqueuing finish first */
  if (t->capture == c) goto out;
  if (t->capture != NULL) {
    st = weft__error(WEFT_ERR_CAPTURE, "weft_capture_join: stream %u already takes part in another capture", t->index);
    goto out;
  }
  /* t's live pending event goes before the wait that pulls t into the capture; the fork point
   * is a recorded tick of the origin covering all its captured work so far. */
  if ((st = weft__clock_flush(tr, tr->live, t)) != WEFT_OK) goto out;
  if ((st = weft__clock_record(tr, &c->dom, c->origin, &fork)) != WEFT_OK) goto out;
  t->capture = c; /* before the wait: it is the wait that pulls t into the capture */
  if ((st = weft__clock_wait(tr, &c->dom, t, c->origin, fork)) != WEFT_OK) {
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
    weft_stream_t *t = &tr->streams[__builtin_ctzll(m)];
    if (t->capture == c) t->capture = NULL;
  }
  if (c->joined != 0) count_capture(c, -1);
  c->joined = 0;
}

weft_status_t weft__capture_end(weft_stream_t *s, weft__capture_t **out, CUgraph *graph) {
  weft__tracker_t *tr = s->tr;
  *graph = NULL;
  weft_status_t st = WEFT_OK;
  lock(tr);
  weft__capture_t *c = *out = own_capture(s);
  if (c == NULL) {
    unlock(tr);
    return weft__error(WEFT_ERR_CAPTURE, "weft_capture_end: stream %u is not the origin of a weft capture", s->index);
  }
  /* Rejoin: the origin waits on a recorded tick of every other stream that took part. */
  for (uint64_t m = c->joined & ~(1ull << c->origin->index); m != 0 && st == WEFT_OK; m &= m - 1) {
    weft_stream_t *t = &tr->streams[__builtin_ctzll(m)];
    uint64_t tick;
    st = weft__clock_record(tr, &c->dom, t, &tick);
    if (st == WEFT_OK) st = weft__clock_wait(tr, &c->dom, c->origin, t, tick);
  }
  /* Its collectives held before the driver's capture ends: a concurrent weft_comm_destroy never
   * finds the capture ended and its graph not yet holding them (weft_capture_end). */
  if (c->collectives) {
    CUstreamCaptureStatus cs;
    if (c->id == 0) (void)weft__capture_status(c->origin, &cs, &c->id); /* (begin could not ask) */
    weft__capture_hold_link(&c->hold, c->id);
  }
  CUgraph g = NULL, dropped[2] = {NULL, NULL};
  CUresult r = tr->drv->cuStreamEndCapture(c->origin->raw, &g);
  if (r != CUDA_SUCCESS) {
    /* The capture must end whatever happened: if the stream still captures (an invalidated
     * capture, or a failure before the driver ended it), end it again and drop its graph. */
    CUstreamCaptureStatus cs;
    if (weft__capture_status(c->origin, &cs, NULL) == CUDA_SUCCESS && cs != CU_STREAM_CAPTURE_STATUS_NONE &&
        tr->drv->cuStreamEndCapture(c->origin->raw, &dropped[0]) != CUDA_SUCCESS)
      dropped[0] = NULL;
    dropped[1] = g;
    g = NULL;
  } else if (st != WEFT_OK) {
    dropped[1] = g; /* the rejoin failed: the graph is not handed out */
    g = NULL;
  }
  detach(c);
  unlock(tr);
  /* A dropped graph may have memory nodes: its destroy is a graph call (WEFT__GRAPH_MEMORY),
   * made outside the tracker lock. */
  for (int i = 0; i < 2; i++)
    if (dropped[i] != NULL) WEFT__GRAPH_MEMORY(tr->ctx, WEFT__RELAXED(tr->drv, tr->drv->cuGraphDestroy(dropped[i])));
  if (st != WEFT_OK) return st;
  if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuStreamEndCapture");
  *graph = g;
  return WEFT_OK;
}

bool weft__capture_foreign_of(weft_stream_t *s, uint64_t *id) {
  if (atomic_load_explicit(&s->capture, memory_order_acquire) == NULL) return false; /* the common case */
  lock(s->tr);
  weft__capture_t *c = s->capture;
  bool foreign = c != NULL && c->foreign;
  if (foreign) *id = c->id;
  unlock(s->tr);
  return foreign;
}

weft__capture_t *weft__capture_foreign(weft_stream_t *s) {
  lock(s->tr);
  weft__capture_t *c = s->capture;
  if (c != NULL && !c->foreign) c = NULL;
  unlock(s->tr);
  return c;
}

weft_status_t weft__capture_redirect(weft_stream_t *s, weft__capture_t *c, weft_resource_t *to,
                                     void (*on_drop)(weft__capture_t *c)) {
  weft_status_t st = WEFT_OK;
  lock(s->tr);
  if (s->capture != c)
    st = weft__error(WEFT_ERR_CAPTURE, "weft_capture_allocate_to: the capture on stream %u ended meanwhile", s->index);
  else if (c->on_drop != NULL && c->alloc_to != to)
    st = weft__error(WEFT_ERR_BUSY, "weft_capture_allocate_to: the capture on stream %u allocates to another graph "
                     "pool already", s->index);
  else if (c->on_drop == NULL) {
    c->alloc_to = to;
    c->on_drop = on_drop;
  }
  unlock(s->tr);
  return st;
}

void weft__capture_note_collective(weft_stream_t *s) {
  lock(s->tr);
  if (s->capture != NULL) s->capture->collectives = true;
  unlock(s->tr);
}

weft__capture_t *weft__capture_drop_foreign(weft_stream_t *s, uint64_t id) {
  lock(s->tr);
  weft__capture_t *c = s->capture;
  if (c != NULL && c->foreign && c->id == id) detach(c); /* every stream that took part leaves it */
  else c = NULL;
  unlock(s->tr);
  return c;
}

void weft__capture_free(weft__capture_t *c) {
  if (c == NULL) return;
  weft__capture_hold_unlink(&c->hold);
  for (size_t i = 0; i < c->blocks.len; i++) weft__meta_free(WEFT__VEC_AT(&c->blocks, weft__capture_block_t, i).local.reads);
  weft__vec_free(&c->blocks);
  weft__map_free(&c->index);
  (void)weft__domain_free(c->tr, &c->dom); /* a capture's events go to the spares: never fails */
  weft__meta_free(c);
}

CUresult weft__capture_status_id(const weft_stream_t *s, CUstreamCaptureStatus *cs, uint64_t *id) {
  const weft__driver_t *drv = s->tr->drv;
  cuuint64_t cid = 0;
  CUresult r = CUDA_SUCCESS;
  if (drv->cuStreamGetCaptureInfo != NULL) r = drv->cuStreamGetCaptureInfo(s->raw, cs, &cid, NULL, NULL, NULL, NULL);
  *id = cid;
  return r;
}

weft_status_t weft__capture_probe_failed(CUresult r) {
  return weft__driver_fail(r, "cuStreamIsCapturing / cuStreamGetCaptureInfo");
}

/* ---- holds ---- */

/* The linked holds, under their own lock (a leaf: nothing is taken inside it). */
static pthread_mutex_t holds_lock = PTHREAD_MUTEX_INITIALIZER;
static weft__capture_hold_t *holds;

void weft__capture_hold_link(weft__capture_hold_t *h, uint64_t id) {
  if (id == 0) return; /* (no id known: nothing to hold by) */
  pthread_mutex_lock(&holds_lock);
  h->id = id;
  h->prev = NULL;
  h->next = holds;
  if (holds != NULL) holds->prev = h;
  holds = h;
  pthread_mutex_unlock(&holds_lock);
}

void weft__capture_hold_unlink(weft__capture_hold_t *h) {
  if (h->id == 0) return;
  pthread_mutex_lock(&holds_lock);
  if (h->prev != NULL) h->prev->next = h->next;
  else holds = h->next;
  if (h->next != NULL) h->next->prev = h->prev;
  h->id = 0;
  pthread_mutex_unlock(&holds_lock);
}

bool weft__capture_held(uint64_t id) {
  pthread_mutex_lock(&holds_lock);
  const weft__capture_hold_t *h = holds;
  while (h != NULL && h->id != id) h = h->next;
  pthread_mutex_unlock(&holds_lock);
  return h != NULL;
}
