/* The fake tracker and fake upstream of fake_runtime.h. */
#include "tests/mem/fake_runtime.h"

#include <stdlib.h>
#include <string.h>

fake_runtime_t fake;

weft_runtime_t *fake_init(unsigned n) {
  memset(&fake, 0, sizeof fake);
  fake.tr.n = n;
  fake.tr.ordinal = 0;
  for (unsigned i = 0; i < n; i++) {
    fake.tr.streams[i].tr = &fake.tr;
    fake.tr.streams[i].index = i;
    fake.tr.streams[i].runtime = &fake;
    fake.tr.streams[i].raw = (CUstream)(uintptr_t)(0x1000 + i);
  }
  return (weft_runtime_t *)&fake;
}

weft_stream_t *fake_stream(unsigned i) { return &fake.tr.streams[i]; }
void fake_work(unsigned i) { fake.tick[i]++; }
void fake_complete(unsigned i) { fake.completed[i] = fake.tick[i]; }

/* The public constructors as lib/runtime gives them (a runtime handle resolved to its tracker),
 * over the fake tracker. */
static weft__tracker_t *resolve(weft_runtime_t *rt, const void *out, const char *who, weft_status_t *st) {
  if (rt == NULL) *st = weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: runtime is NULL", who);
  else if ((void *)rt != (void *)&fake || fake.released) *st = weft__error(WEFT_ERR_STALE_HANDLE, "%s: released", who);
  else if (out == NULL) *st = weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: out is NULL", who);
  else return &fake.tr;
  return NULL;
}

weft_status_t weft_pool_create(weft_runtime_t *rt, weft_resource_t *upstream, const weft_pool_options_t *opts,
                               weft_resource_t **out) {
  weft_status_t st;
  weft__tracker_t *tr = resolve(rt, out, "weft_pool_create", &st);
  return tr ? weft__pool_create(tr, rt, upstream, opts, out) : st;
}

weft_status_t weft_budget_create(weft_runtime_t *rt, weft_resource_t *upstream, uint64_t limit, const char *key,
                                 weft_resource_t **out) {
  weft_status_t st;
  weft__tracker_t *tr = resolve(rt, out, "weft_budget_create", &st);
  return tr ? weft__budget_create(tr, rt, upstream, limit, key, out) : st;
}

weft_status_t weft_logging_create(weft_runtime_t *rt, weft_resource_t *upstream, const char *path, weft_log_sink_fn sink,
                                  void *user, weft_resource_t **out) {
  weft_status_t st;
  weft__tracker_t *tr = resolve(rt, out, "weft_logging_create", &st);
  return tr ? weft__logging_create(tr, rt, upstream, path, sink, user, false, out) : st;
}

weft_status_t weft_logging_create_rmm(weft_runtime_t *rt, weft_resource_t *upstream, const char *path,
                                      weft_log_sink_fn sink, void *user, weft_resource_t **out) {
  weft_status_t st;
  weft__tracker_t *tr = resolve(rt, out, "weft_logging_create_rmm", &st);
  return tr ? weft__logging_create(tr, rt, upstream, path, sink, user, true, out) : st;
}

weft_status_t weft_resource_destroy(weft_resource_t *r) {
  return r != NULL && r->ops != NULL ? weft__resource_destroy(r) : WEFT_ERR_INVALID_ARGUMENT;
}

weft_status_t weft_stats_create(weft_runtime_t *rt, weft_resource_t *upstream, weft_resource_t **out) {
  weft_status_t st;
  weft__tracker_t *tr = resolve(rt, out, "weft_stats_create", &st);
  return tr ? weft__stats_create(tr, rt, upstream, out) : st;
}

weft_status_t weft__tracker_bind(weft__tracker_t *tr) { return WEFT_OK; }
weft_status_t weft__tracker_hold(weft_stream_t *s, const char *fn) { return WEFT_OK; }
void weft__tracker_unhold(weft_stream_t *s) { (void)s; }
weft_stream_t *weft__tracker_hold_live(weft__tracker_t *tr, const char *fn) { return &tr->streams[0]; }
weft__capture_t *weft__tracker_capture_of(weft_stream_t *s, weft_resource_t **alloc_to) { return NULL; }
void weft__tracker_touch(weft_stream_t *s) { (void)s; }

weft__point_t weft__tracker_point(weft_stream_t *s) {
  weft__point_t p = {s->index, fake.tick[s->index]};
  return p;
}

bool weft__tracker_is_ordered(weft_stream_t *s, weft__point_t p) {
  if (p.tick == 0) return true;
  if (p.stream == s->index) return p.tick <= fake.tick[s->index];
  return fake.known[s->index * FAKE_STREAMS + p.stream] >= p.tick || fake.host_known[p.stream] >= p.tick;
}

weft_status_t weft__tracker_order(weft_stream_t *s, weft__point_t p) {
  if (weft__tracker_is_ordered(s, p)) return WEFT_OK;
  if (fake.fail_order != WEFT_OK) return weft__error(fake.fail_order, "fake: cuStreamWaitEvent failed");
  fake.waits++;
  fake.last_wait = p;
  fake.known[s->index * FAKE_STREAMS + p.stream] = p.tick;
  return WEFT_OK;
}

bool weft__tracker_poll(weft__tracker_t *tr, weft__point_t p) {
  fake.polls++;
  if (p.tick <= fake.completed[p.stream]) {
    if (fake.host_known[p.stream] < p.tick) fake.host_known[p.stream] = p.tick;
    return true;
  }
  return false;
}

/* The host waits: the device finishes each point's stream (at least up to the point). */
weft_status_t weft__tracker_sync_points(weft__tracker_t *tr, const weft__point_t *pts, size_t n) {
  fake.syncs++;
  for (size_t i = 0; i < n; i++) {
    if (fake.completed[pts[i].stream] < pts[i].tick) fake.completed[pts[i].stream] = pts[i].tick;
    if (fake.host_known[pts[i].stream] < pts[i].tick) fake.host_known[pts[i].stream] = pts[i].tick;
  }
  return WEFT_OK;
}

weft_status_t weft__tracker_sync_all(weft__tracker_t *tr) {
  for (unsigned i = 0; i < tr->n; i++) fake_complete(i);
  return WEFT_OK;
}

/* ---- fake upstream ------------------------------------------------------------------------ */

static int find_slot(fake_upstream_t *u, CUdeviceptr p) {
  for (int i = 0; i < 4096; i++)
    if (u->ptrs[i] == p) return i;
  return -1;
}

static weft_status_t up_alloc(weft_resource_t *self, size_t bytes, weft_stream_t *s, const char *tag, CUdeviceptr *out) {
  fake_upstream_t *u = (fake_upstream_t *)self;
  pthread_mutex_lock(&u->lock);
  weft_status_t st = u->fail_alloc;
  if (st == WEFT_OK && u->capacity != 0 && u->live_bytes + bytes > u->capacity) st = WEFT_ERR_OUT_OF_MEMORY;
  int slot = st == WEFT_OK ? find_slot(u, 0) : -1;
  if (st == WEFT_OK && slot < 0) st = WEFT_ERR_OUT_OF_MEMORY;
  if (st != WEFT_OK) {
    pthread_mutex_unlock(&u->lock);
    return weft__error(st, "fake upstream: allocation of %zu bytes refused", bytes);
  }
  CUdeviceptr p = u->next;
  u->next += (bytes + 4095) / 4096 * 4096 + 4096; /* a gap: chunks are never adjacent */
  u->ptrs[slot] = p;
  u->sizes[slot] = bytes;
  u->tags[slot] = tag;
  u->live_bytes += bytes;
  u->live_count++;
  u->allocs++;
  pthread_mutex_unlock(&u->lock);
  *out = p;
  return WEFT_OK;
}

static weft_status_t up_free(weft_resource_t *self, CUdeviceptr p, size_t bytes, weft_stream_t *s, const char *tag) {
  fake_upstream_t *u = (fake_upstream_t *)self;
  pthread_mutex_lock(&u->lock);
  weft_status_t st = u->fail_free;
  int slot = find_slot(u, p);
  if (st == WEFT_OK && (slot < 0 || u->sizes[slot] != bytes || u->tags[slot] != tag)) st = WEFT_ERR_INVALID_ARGUMENT;
  if (st != WEFT_OK) {
    pthread_mutex_unlock(&u->lock);
    return weft__error(st, "fake upstream: free of 0x%llx (%zu bytes) refused", (unsigned long long)p, bytes);
  }
  u->ptrs[slot] = 0;
  u->last_free_stream = s->index;
  u->live_bytes -= bytes;
  u->live_count--;
  u->frees++;
  pthread_mutex_unlock(&u->lock);
  return WEFT_OK;
}

static void up_stats(const weft_resource_t *self, weft_resource_stats_t *out) {
  fake_upstream_t *u = (fake_upstream_t *)self;
  out->live_bytes = out->reserved_bytes = u->live_bytes;
  out->allocs = u->allocs;
  out->frees = u->frees;
}

static const weft_resource_ops_t up_ops = {"fake", up_alloc, up_free, up_stats, NULL, NULL};

fake_upstream_t *fake_upstream_create(weft_runtime_t *rt) {
  fake_upstream_t *u = calloc(1, sizeof *u);
  u->base.ops = &up_ops;
  u->base.rt = rt;
  u->next = 0x7f0000000000ull;
  pthread_mutex_init(&u->lock, NULL);
  return u;
}

void fake_upstream_destroy(fake_upstream_t *u) {
  pthread_mutex_destroy(&u->lock);
  free(u);
}
