/* Clock domains, event rings, and the record and wait operations (clock.h). */
#include <stdio.h>
#include <string.h>

#include "lib/core/debug.h"
#include "lib/core/error.h"
#include "lib/core/meta.h"
#include "lib/core/nvtx.h"
#include "lib/core/trace.h"
#include "streams/clock.h"

/* A lane's events go back: a capture's to the tracker's spares (the caller holds the tracker
 * lock; capacity was reserved when they were made), the live domain's to the driver (the first
 * failure is returned). */
static weft_status_t lane_free(weft__tracker_t *tr, weft__domain_t *d, weft__lane_t *l) {
  weft_status_t first = WEFT_OK;
  if (l->ring != NULL)
    for (unsigned i = 0; i < d->ring_size; i++) {
      if (l->ring[i] == NULL) continue;
      if (d->capture != NULL) {
        *(CUevent *)weft__vec_push(&tr->spare_events) = l->ring[i];
        continue;
      }
      CUresult r = tr->drv->cuEventDestroy(l->ring[i]);
      if (r != CUDA_SUCCESS && first == WEFT_OK) first = weft__driver_fail(r, "cuEventDestroy");
    }
  weft__meta_free(l->ring);
  weft__meta_free(l->ring_tick);
  weft__meta_free(l->ring_clock);
  weft__meta_free(l->ring_us);
  l->ring = NULL;
  l->ring_tick = NULL;
  l->ring_clock = NULL;
  l->ring_us = NULL;
  return first;
}

/* Capture domains create their events on first use: most captures touch few streams. They take
 * the tracker's spare events first (the caller holds the tracker lock). */
weft_status_t weft__lane_init(weft__tracker_t *tr, weft__domain_t *d, weft__lane_t *l) {
  if (l->ring != NULL) return WEFT_OK;
  size_t clocks;
  if (!weft__mul_size(d->ring_size, d->n, &clocks)) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: ring too large");
  l->ring = weft__meta_calloc(d->ring_size, sizeof *l->ring);
  l->ring_tick = weft__meta_calloc(d->ring_size, sizeof *l->ring_tick);
  l->ring_clock = weft__meta_calloc(clocks, sizeof *l->ring_clock);
  l->ring_us = weft__meta_calloc(d->ring_size, sizeof *l->ring_us);
  weft__vec_t *spare = &tr->spare_events;
  unsigned taken = 0;
  bool ok = l->ring != NULL && l->ring_tick != NULL && l->ring_clock != NULL && l->ring_us != NULL;
  if (ok && d->capture != NULL) {
    while (taken < d->ring_size && spare->len != 0) l->ring[taken++] = WEFT__VEC_AT(spare, CUevent, --spare->len);
    /* Room to take back every event captures will then have made. */
    ok = weft__vec_reserve(spare, tr->capture_events + (d->ring_size - taken) - spare->len);
  }
  if (!ok) {
    (void)lane_free(tr, d, l); /* the live domain has no events yet; a capture's go back */
    return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: no host memory for an event ring");
  }
  for (unsigned i = taken; i < d->ring_size; i++) {
    CUresult r = tr->drv->cuEventCreate(&l->ring[i], CU_EVENT_DISABLE_TIMING);
    if (r != CUDA_SUCCESS) {
      l->ring[i] = NULL;
      (void)lane_free(tr, d, l); /* only the live domain destroys, and its failure is not this one */
      return weft__driver_fail(r, "cuEventCreate");
    }
    if (d->capture != NULL) tr->capture_events++;
  }
  return WEFT_OK;
}

weft_status_t weft__domain_init(weft__domain_t *d, unsigned n, unsigned ring_size, weft__capture_t *capture) {
  memset(d, 0, sizeof *d);
  d->n = n;
  d->ring_size = ring_size;
  d->capture = capture;
  d->known = weft__meta_calloc((size_t)n * n, sizeof *d->known);
  d->host_known = weft__meta_calloc(n, sizeof *d->host_known);
  if (d->known == NULL || d->host_known == NULL) {
    weft__meta_free(d->known);
    weft__meta_free(d->host_known);
    memset(d, 0, sizeof *d);
    return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: no host memory for stream clocks");
  }
  return WEFT_OK;
}

weft_status_t weft__domain_free(weft__tracker_t *tr, weft__domain_t *d) {
  weft_status_t first = WEFT_OK;
  if (d->capture != NULL) pthread_mutex_lock(&tr->lock);
  for (unsigned i = 0; i < d->n; i++) {
    weft_status_t st = lane_free(tr, d, &d->lane[i]);
    if (first == WEFT_OK) first = st;
  }
  if (d->capture != NULL) pthread_mutex_unlock(&tr->lock);
  weft__meta_free(d->known);
  weft__meta_free(d->host_known);
  memset(d, 0, sizeof *d);
  return first;
}

weft_status_t weft__clock_flush(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *s) {
  weft__lane_t *l = &d->lane[s->index];
  if (l->recorded == l->tick) return WEFT_OK;
  weft_status_t st = weft__lane_init(tr, d, l);
  if (st != WEFT_OK) return st;
  uint64_t k = l->tick;
  unsigned slot = (unsigned)(k & (d->ring_size - 1));
  CUresult r = tr->drv->cuEventRecord(l->ring[slot], s->raw);
  if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuEventRecord");
  memcpy(&l->ring_clock[(size_t)slot * d->n], WEFT__ROW(d, s->index), d->n * sizeof(uint64_t));
  l->ring_tick[slot] = k;
  l->recorded = k;
  l->deferred = false;
  l->joined = 0;
  if (weft__trace_on()) l->ring_us[slot] = weft__trace_now_us();
  tr->counters.events_recorded++;
  return WEFT_OK;
}

uint64_t weft__clock_point(weft__domain_t *d, const weft_stream_t *s) {
  weft__lane_t *l = &d->lane[s->index];
  if (l->dirty) {
    /* New work or waits since the newest tick: a new tick covers them, unless one is pending
     * already (its event, recorded later, lands after this work too). */
    if (l->tick == l->recorded) {
      l->tick++;
      WEFT__ROW(d, s->index)[s->index] = l->tick;
    }
    l->dirty = false;
  }
  return l->tick;
}

uint64_t weft__clock_defer(weft__domain_t *d, weft_stream_t *s) {
  weft__lane_t *l = &d->lane[s->index];
  if (l->tick == l->recorded) {
    l->tick++;
    WEFT__ROW(d, s->index)[s->index] = l->tick;
  } else if (l->deferred) {
    l->joined++;
  }
  l->dirty = false;
  l->deferred = true;
  return l->tick;
}

void weft__clock_needed(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *t, uint64_t k) {
  weft__lane_t *l = &d->lane[t->index];
  if (!l->deferred || k <= l->recorded) return;
  l->eager = true;
  if (l->joined != 0) tr->counters.late_waits++;
}

weft_status_t weft__clock_record(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *s, uint64_t *tick) {
  weft__lane_t *l = &d->lane[s->index];
  if (l->tick == l->recorded) {
    l->tick++;
    WEFT__ROW(d, s->index)[s->index] = l->tick;
  }
  l->dirty = false;
  *tick = l->tick;
  return weft__clock_flush(tr, d, s);
}

weft_status_t weft__clock_slot(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *t, uint64_t k, unsigned *slot) {
  weft_status_t st = weft__clock_flush(tr, d, t);
  if (st != WEFT_OK) return st;
  weft__lane_t *l = &d->lane[t->index];
  unsigned mask = d->ring_size - 1;
  WEFT_ASSERT_INTERNAL(k >= 1 && k <= l->recorded);
  if (l->ring_tick[k & mask] == k) {
    *slot = (unsigned)(k & mask);
    return WEFT_OK;
  }
  /* Evicted: ticks (recorded - ring_size, recorded] are in the ring (every tick is recorded, in
   * order: a stream never skips one). */
  WEFT_ASSERT_INTERNAL(k + d->ring_size <= l->recorded);
  *slot = (unsigned)((l->recorded - d->ring_size + 1) & mask);
  tr->counters.ring_evictions++;
  return WEFT_OK;
}

weft_status_t weft__clock_wait(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *s, weft_stream_t *t, uint64_t k) {
  unsigned slot;
  weft_status_t st = weft__clock_slot(tr, d, t, k, &slot);
  if (st != WEFT_OK) return st;
  const weft__lane_t *lt = &d->lane[t->index];
  CUresult r = tr->drv->cuStreamWaitEvent(s->raw, lt->ring[slot], 0);
  if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuStreamWaitEvent");
  uint64_t *row = WEFT__ROW(d, s->index);
  const uint64_t *snap = &lt->ring_clock[(size_t)slot * d->n];
  for (unsigned u = 0; u < d->n; u++) row[u] = weft__max_u64(row[u], snap[u]);
  row[t->index] = weft__max_u64(row[t->index], lt->ring_tick[slot]);
  row[s->index] = d->lane[s->index].tick; /* own entry is always the own tick */
  d->lane[s->index].dirty = true;
  tr->counters.waits_issued++;
  if (weft__trace_on()) {
    uint64_t id = d->capture != NULL ? d->capture->id : 0;
    weft__trace_wait(tr->ordinal, weft__trace_tid(t->index, id), lt->ring_us[slot], weft__trace_tid(s->index, id));
  }
  if (weft__nvtx_on()) {
    char m[96];
    snprintf(m, sizeof m, "weft wait: stream %u waits for stream %u (tick %llu)", s->index, t->index,
             (unsigned long long)lt->ring_tick[slot]);
    weft__nvtx_mark(m);
  }
  return WEFT_OK;
}
