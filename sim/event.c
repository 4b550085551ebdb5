/* Events: records, waits, queries, synchronisation and timing.
 *
 * Each cuEventRecord outside capture creates a *record instance* (sim__einst_t): a waiter binds
 * to the instance that is the event's latest at the time of its call (as the driver does), so a
 * later re-record does not change what an earlier wait waits for. An instance completes when its
 * record op runs, carrying the recording stream's clock; waiting joins that clock.
 *
 * Inside a capture, a record instead remembers the capture and its current dependency nodes; a
 * wait on it from another stream forks that stream into the capture (capture.c).
 */
#include <stdlib.h>
#include <string.h>

#include "sim/internal.h"

sim__einst_t *sim__einst_new(void) {
  sim__einst_t *i = sim__xcalloc(1, sizeof *i);
  i->refs = 1;
  return i;
}

void sim__links_set(sim__links_t *dst, int stream, uint64_t seq) {
  for (size_t i = 0; i < dst->n; i++)
    if (dst->v[i].stream == stream) {
      if (dst->v[i].seq < seq) dst->v[i].seq = seq;
      return;
    }
  sim__grow(&dst->v, &dst->cap, dst->n + 1, sizeof *dst->v);
  dst->v[dst->n++] = (struct sim__link){stream, seq};
}

/* Per stream id, whether it is gone (sim__links_forget). */
static unsigned char *g_gone;
static size_t g_gone_cap;

void sim__links_forget(int stream) {
  if (stream < 0) return;
  if ((size_t)stream >= g_gone_cap) {
    size_t cap = g_gone_cap ? g_gone_cap : 64;
    while (cap <= (size_t)stream) cap *= 2;
    g_gone = sim__xrealloc(g_gone, cap);
    memset(g_gone + g_gone_cap, 0, cap - g_gone_cap);
    g_gone_cap = cap;
  }
  g_gone[stream] = 1;
}

static int gone(int stream) { return stream >= 0 && (size_t)stream < g_gone_cap && g_gone[stream]; }

void sim__links_join(sim__links_t *dst, const sim__links_t *src) {
  size_t k = 0; /* dst's own entries of streams gone go too */
  for (size_t i = 0; i < dst->n; i++)
    if (!gone(dst->v[i].stream)) dst->v[k++] = dst->v[i];
  dst->n = k;
  for (size_t i = 0; i < src->n; i++)
    if (!gone(src->v[i].stream)) sim__links_set(dst, src->v[i].stream, src->v[i].seq);
}

uint64_t sim__links_get(const sim__links_t *l, int stream) {
  for (size_t i = 0; i < l->n; i++)
    if (l->v[i].stream == stream) return l->v[i].seq;
  return 0;
}

void sim__links_free(sim__links_t *l) {
  free(l->v);
  *l = (sim__links_t){0};
}

void sim__einst_unref(sim__einst_t *i) {
  if (i == NULL || --i->refs > 0) return;
  sim__links_free(&i->links);
  sim__vc_free(&i->vc);
  free(i);
}

void sim__einst_complete(sim__einst_t *i, const sim__vc_t *vc) {
  if (sim.oracle) sim__vc_copy(&i->vc, vc);
  i->time = sim.stats.ops_executed;
  i->done = 1;
}

static void clear_capture(sim__event_t *e) {
  e->cap = NULL;
  free(e->cap_deps);
  e->cap_deps = NULL;
  e->ncap_deps = 0;
}

void sim__event_ref(sim__event_t *e) { e->refs++; }

void sim__event_unref(sim__event_t *e) {
  if (--e->refs > 0) return;
  sim__einst_unref(e->latest);
  clear_capture(e);
  free(e);
}

void sim__events_capture_ended(sim__capture_t *cap) {
  for (size_t i = 0; i < cap->nevents; i++) {
    sim__event_t *e = cap->events[i];
    if (e->cap == cap) {
      clear_capture(e);
      e->cap_ended = 1;
    }
    sim__event_unref(e);
  }
  free(cap->events);
  cap->events = NULL;
  cap->nevents = cap->capevents = 0;
}

static sim__event_t *event_get(CUevent h) { return sim__handle_get(h, SIM_MAGIC_EVENT); }

static CUresult event_create(CUevent *out, unsigned flags) {
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if ((flags & ~known) != 0) return CUDA_ERROR_INVALID_VALUE;
  if ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING)) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = sim__need_ctx();
  if (r != CUDA_SUCCESS) return r;
  sim__event_t *e = sim__xcalloc(1, sizeof *e);
  e->magic = SIM_MAGIC_EVENT;
  e->flags = flags;
  e->dev = sim__cur_dev();
  e->refs = 1;
  sim__handle_add(e);
  *out = (CUevent)e;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags) { SIM_CALL(cuEventCreate, event_create(phEvent, Flags)); }

static CUresult event_record(CUevent h, CUstream hs, unsigned flags) {
  sim__event_t *e = event_get(h);
  sim__stream_t *s = sim__stream_get(hs);
  if (e == NULL || s == NULL) return CUDA_ERROR_INVALID_HANDLE;
  /* An event is recorded only on a stream of its own context's device; any stream may wait on
   * it (2 x H100, driver 580.159.04). */
  if (e->dev != s->dev) return CUDA_ERROR_INVALID_HANDLE;
  CUresult li_ = sim__legacy_implicit(hs, 1);
  if (li_ != CUDA_SUCCESS) return li_;
  if ((flags & ~(unsigned)CU_EVENT_RECORD_EXTERNAL) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (s->cap != NULL) {
    sim__capture_t *c = s->cap;
    if (c->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (flags & CU_EVENT_RECORD_EXTERNAL) {
      sim__action_t act = {.kind = SIM_ACT_EVENT_RECORD};
      act.u.event.ev = e;
      sim__event_ref(e);
      CUresult r = sim__capture_add(s, &act, CU_GRAPH_NODE_TYPE_EVENT_RECORD, NULL);
      if (r != CUDA_SUCCESS) return r;
    }
    if (e->cap != c) {
      sim__grow(&c->events, &c->capevents, c->nevents + 1, sizeof *c->events);
      c->events[c->nevents++] = e;
      sim__event_ref(e);
    }
    clear_capture(e);
    e->cap_ended = 0;
    e->cap = c;
    e->ncap_deps = s->ndeps;
    e->cap_deps = sim__xmalloc((s->ndeps + 1) * sizeof *e->cap_deps);
    if (s->ndeps) memcpy(e->cap_deps, s->deps, s->ndeps * sizeof *e->cap_deps);
    return CUDA_SUCCESS;
  }
  clear_capture(e);
  e->cap_ended = 0;
  sim__einst_t *inst = sim__einst_new();
  sim__einst_unref(e->latest);
  e->latest = inst;
  sim__action_t act = {.kind = SIM_ACT_EVENT_RECORD};
  act.u.event.ev = e;
  act.u.event.inst = inst;
  sim__event_ref(e);
  inst->refs++;
  sim__enqueue(s, &act);
  sim__links_join(&inst->links, &s->links);
  if (s->pooled) sim__links_set(&inst->links, s->id, s->issued);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream) {
  SIM_CALL(cuEventRecord, event_record(hEvent, hStream, 0));
}

CUresult CUDAAPI cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags) {
  SIM_CALL(cuEventRecordWithFlags, event_record(hEvent, hStream, flags));
}

static CUresult stream_wait_event(CUstream hs, CUevent h, unsigned flags) {
  sim__stream_t *s = sim__stream_get(hs);
  sim__event_t *e = event_get(h);
  if (s == NULL || e == NULL) return CUDA_ERROR_INVALID_HANDLE;
  CUresult li_ = sim__legacy_implicit(hs, 1);
  if (li_ != CUDA_SUCCESS) return li_;
  if ((flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL) != 0) return CUDA_ERROR_INVALID_VALUE;
  /* An event whose last record was captured by a capture that ended is unusable (measured on an
   * H200: CUDA_ERROR_INVALID_VALUE) until it is recorded again. */
  if (e->cap_ended) return CUDA_ERROR_INVALID_VALUE;
  if (s->cap != NULL) {
    sim__capture_t *c = s->cap;
    if (c->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (flags & CU_EVENT_WAIT_EXTERNAL) {
      sim__action_t act = {.kind = SIM_ACT_EVENT_WAIT};
      act.u.event.ev = e;
      sim__event_ref(e);
      return sim__capture_add(s, &act, CU_GRAPH_NODE_TYPE_WAIT_EVENT, NULL);
    }
    if (e->cap == c) {
      sim__stream_set_deps(s, e->cap_deps, e->ncap_deps, 1);
      return CUDA_SUCCESS;
    }
    if (e->cap != NULL) {
      sim__capture_invalidate(c);
      return CUDA_ERROR_STREAM_CAPTURE_MERGE;
    }
    if (e->latest == NULL) return CUDA_SUCCESS;
    /* Work outside the capture cannot be a dependency of captured work. */
    sim__capture_invalidate(c);
    return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
  }
  if (e->cap != NULL) {
    if (s->is_null) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    sim__capture_join(s, e->cap, e->cap_deps, e->ncap_deps);
    return CUDA_SUCCESS;
  }
  if (e->latest == NULL) return CUDA_SUCCESS;
  sim__action_t act = {.kind = SIM_ACT_EVENT_WAIT};
  act.u.event.ev = e;
  act.u.event.inst = e->latest;
  sim__event_ref(e);
  e->latest->refs++;
  sim__links_join(&s->links, &e->latest->links);
  sim__enqueue(s, &act);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  SIM_CALL(cuStreamWaitEvent, stream_wait_event(hStream, hEvent, Flags));
}

/* Checks common to query and synchronize (measured on an H200, driver 580): an event recorded
 * in a live capture -> CUDA_ERROR_CAPTURED_EVENT, and that capture is invalidated; one recorded in
 * a capture that ended -> CUDA_ERROR_INVALID_VALUE; otherwise the call is unsafe under capture. */
static CUresult check_capture(sim__event_t *e) {
  if (e->cap != NULL) {
    sim__capture_invalidate(e->cap);
    return CUDA_ERROR_CAPTURED_EVENT;
  }
  if (e->cap_ended) return CUDA_ERROR_INVALID_VALUE;
  return sim__capture_unsafe();
}

static CUresult event_query(CUevent h) {
  sim__event_t *e = event_get(h);
  if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
  CUresult r = check_capture(e);
  if (r != CUDA_SUCCESS) return r;
  if (e->latest == NULL) return CUDA_SUCCESS;
  if (!e->latest->done) return CUDA_ERROR_NOT_READY;
  sim__host_join(&e->latest->vc);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventQuery(CUevent hEvent) { SIM_CALL(cuEventQuery, event_query(hEvent)); }

static int inst_done(void *arg) { return ((sim__einst_t *)arg)->done; }

static CUresult event_sync(CUevent h) {
  sim__event_t *e = event_get(h);
  if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
  CUresult r = check_capture(e);
  if (r != CUDA_SUCCESS || e->latest == NULL) return r;
  sim__einst_t *i = e->latest;
  i->refs++;
  r = sim__run_until(inst_done, i);
  if (r == CUDA_SUCCESS) {
    sim__host_join(&i->vc);
    sim__pools_release();
  }
  sim__einst_unref(i);
  return r;
}

CUresult CUDAAPI cuEventSynchronize(CUevent hEvent) { SIM_CALL(cuEventSynchronize, event_sync(hEvent)); }

static CUresult event_destroy(CUevent h) {
  sim__event_t *e = event_get(h);
  if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
  sim__handle_remove(e);
  e->destroyed = 1;
  sim__event_unref(e);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventDestroy(CUevent hEvent) { SIM_CALL(cuEventDestroy, event_destroy(hEvent)); }

static CUresult elapsed(float *ms, CUevent hstart, CUevent hend) {
  if (ms == NULL) return CUDA_ERROR_INVALID_VALUE;
  sim__event_t *a = event_get(hstart), *b = event_get(hend);
  if (a == NULL || b == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
  if (a->latest == NULL || b->latest == NULL) return CUDA_ERROR_INVALID_HANDLE;
  if (!a->latest->done || !b->latest->done) return CUDA_ERROR_NOT_READY;
  /* Virtual time: one microsecond per executed op, plus half a microsecond so that two records
   * with nothing between them still give a small positive time, as a GPU does. */
  int64_t d = (int64_t)(b->latest->time - a->latest->time);
  *ms = (float)d * 0.001f + 0.0005f;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
  SIM_CALL(cuEventElapsedTime, elapsed(pMilliseconds, hStart, hEnd));
}
