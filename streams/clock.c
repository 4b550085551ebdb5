/* Clock domains, event rings, and the record and wait operations (clock.h). */
#include <stdio.h>
#include <string.h>

#include "lib/core/debug.h"
#include "lib/core/error.h"
#include "lib/core/meta.h"
#include "lib/core/nvtx.h"
#include "lib/core/trace.h"
#include "streams/clock.h"

/* A thread that finds the lock held spins briefly before sleeping in the kernel (lib/core/lock.h;
 * before, an adaptive pthread mutex, which does the same): its holds are short (a use's
 * bookkeeping), and with a mutex that sleeps at once two threads using streams of their own paid
 * a futex wait and wake about once per 700 uses: 348-604 ns a use against 204-280 spinning first
 * (tools/probes/probe_thread_uses, bench/data/cpu-sim-b14fcb4). A lock and unlock are one locked
 * instruction each, inline (a use takes the lock twice). */
weft__lock_t weft__clock_lock = WEFT__LOCK_INIT;
weft__cond_t weft__clock_idle = WEFT__COND_INIT;

typedef struct idle_ask {
  const weft__lanes_atomic_t *busy;
  weft__lanes_t lanes;
} idle_ask_t;

static bool lanes_idle(const void *arg) {
  const idle_ask_t *a = arg;
  return (weft__lanes_load(a->busy) & a->lanes) == 0;
}

void weft__clock_idle_wait(weft__tracker_t *tr, weft__lanes_t lanes) {
  idle_ask_t a = {&tr->live->busy, lanes};
  weft__cond_wait_unless(&weft__clock_idle, tr->lock, lanes_idle, &a);
}

/* The process's live domain: created with the first runtime, kept for the process (its lanes'
 * events go with their runtimes). `used` marks lanes some runtime holds. */
static weft__domain_t g_live;
static bool g_used[WEFT__MAX_LANES];
static _Atomic unsigned g_lanes; /* g_live.n, readable without the lock */
static _Atomic unsigned g_trackers; /* trackers holding lanes (written under the lock) */

unsigned weft__tracker_lanes(void) { return atomic_load_explicit(&g_lanes, memory_order_acquire); }
unsigned weft__tracker_runtimes(void) { return atomic_load_explicit(&g_trackers, memory_order_acquire); }

/* Frees a lane's ring arrays (not its events) and clears them. */
static void ring_arrays_free(weft__lane_t *l) {
  weft__meta_free(l->ring);
  weft__meta_free(l->ring_tick);
  weft__meta_free(l->ring_clock);
  weft__meta_free(l->ring_us);
  weft__meta_free(l->ring_use);
  l->ring = NULL;
  l->ring_tick = l->ring_clock = l->ring_us = l->ring_use = NULL;
}

weft_status_t weft__lane_free(weft__tracker_t *tr, weft__domain_t *d, weft__lane_t *l) {
  weft_status_t first = WEFT_OK;
  if (l->ring != NULL)
    for (unsigned i = 0; i < l->ring_size; i++) {
      if (l->ring[i] == NULL) continue;
      if (d->capture != NULL) {
        *(CUevent *)weft__vec_push(&tr->spare_events) = l->ring[i];
        continue;
      }
      CUresult r = tr->drv->cuEventDestroy(l->ring[i]);
      if (r != CUDA_SUCCESS && first == WEFT_OK) first = weft__driver_fail(r, "cuEventDestroy");
    }
  ring_arrays_free(l);
  return first;
}

/* Capture domains create their events on first use: most captures touch few streams. They take
 * the tracker's spare events first (the caller holds the tracker lock). */
weft_status_t weft__lane_init(weft__tracker_t *tr, weft__domain_t *d, weft__lane_t *l) {
  if (l->ring != NULL) return WEFT_OK;
  l->ring_size = d->capture != NULL ? d->ring_size : tr->ring_size;
  size_t clocks;
  if (!weft__mul_size(l->ring_size, d->stride, &clocks)) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: ring too large");
  l->ring = weft__meta_calloc(l->ring_size, sizeof *l->ring);
  l->ring_tick = weft__meta_calloc(l->ring_size, sizeof *l->ring_tick);
  l->ring_clock = weft__meta_calloc(clocks, sizeof *l->ring_clock);
  l->ring_us = weft__meta_calloc(l->ring_size, sizeof *l->ring_us);
  l->ring_use = weft__meta_calloc(l->ring_size, sizeof *l->ring_use);
  weft__vec_t *spare = &tr->spare_events;
  unsigned taken = 0;
  bool ok = l->ring != NULL && l->ring_tick != NULL && l->ring_clock != NULL && l->ring_us != NULL &&
            l->ring_use != NULL;
  if (ok && d->capture != NULL) {
    while (taken < l->ring_size && spare->len != 0) l->ring[taken++] = WEFT__VEC_AT(spare, CUevent, --spare->len);
    /* Room to take back every event captures will then have made. */
    ok = weft__vec_reserve(spare, tr->capture_events + (l->ring_size - taken) - spare->len);
  }
  if (!ok) {
    (void)weft__lane_free(tr, d, l); /* the live domain has no events yet; a capture's go back */
    return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: no host memory for an event ring");
  }
  /* Event creation needs tr's context current (a use on a stream that names its context does
   * not bind it). */
  weft_status_t bound = taken < l->ring_size ? weft__tracker_bind(tr) : WEFT_OK;
  if (bound != WEFT_OK) {
    (void)weft__lane_free(tr, d, l);
    return bound;
  }
  for (unsigned i = taken; i < l->ring_size; i++) {
    CUresult r = tr->drv->cuEventCreate(&l->ring[i], CU_EVENT_DISABLE_TIMING);
    if (r != CUDA_SUCCESS) {
      l->ring[i] = NULL;
      (void)weft__lane_free(tr, d, l); /* only the live domain destroys, and its failure is not this one */
      return weft__driver_fail(r, "cuEventCreate");
    }
    if (d->capture != NULL) tr->capture_events++;
  }
  return WEFT_OK;
}

/* Frees a domain's arrays (not its lanes' events) and clears it. */
static void domain_arrays_free(weft__domain_t *d) {
  weft__meta_free(d->known);
  weft__meta_free(d->host_known);
  weft__meta_free(d->stream);
  weft__meta_free(d->lane);
  memset(d, 0, sizeof *d);
}

/* The arrays of a domain with room for `lanes` lanes and clocks of `stride` entries (zeroed). */
static bool domain_alloc(weft__domain_t *d, unsigned lanes, unsigned stride) {
  d->stride = stride;
  d->known = weft__meta_calloc((size_t)stride * stride + 1, sizeof *d->known);
  d->host_known = weft__meta_calloc(lanes, sizeof *d->host_known);
  d->stream = weft__meta_calloc(lanes, sizeof *d->stream);
  d->lane = weft__meta_calloc(lanes, sizeof *d->lane);
  if (d->known != NULL && d->host_known != NULL && d->stream != NULL && d->lane != NULL) return true;
  domain_arrays_free(d);
  return false;
}

weft_status_t weft__domain_init(weft__domain_t *d, unsigned n, unsigned ring_size, weft__capture_t *capture) {
  memset(d, 0, sizeof *d);
  if (!domain_alloc(d, n, n)) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: no host memory for stream clocks");
  d->n = n;
  d->ring_size = ring_size;
  d->capture = capture;
  for (unsigned i = 0; i < n; i++) d->stream[i] = &capture->tr->streams[i];
  return WEFT_OK;
}

weft_status_t weft__domain_free(weft__tracker_t *tr, weft__domain_t *d) {
  weft__lock(tr->lock);
  for (unsigned i = 0; i < d->n; i++) (void)weft__lane_free(tr, d, &d->lane[i]); /* to the spares: never fails */
  weft__unlock(tr->lock);
  domain_arrays_free(d);
  return WEFT_OK;
}

/* Makes the live domain's clocks (rows and ring snapshots) `need` entries long or more. They are
 * only as long as the lanes in use (rounded up to 16), not WEFT__MAX_LANES: a record copies a
 * row and a wait reads a snapshot, and short ones stay in the cache. Lock held; on failure
 * nothing changed. */
static weft_status_t live_restride(weft__domain_t *d, unsigned need) {
  if (need <= d->stride) return WEFT_OK;
  unsigned ns = (need + 15u) & ~15u;
  if (ns > WEFT__MAX_LANES) ns = WEFT__MAX_LANES;
  uint64_t *known = weft__meta_calloc((size_t)ns * ns, sizeof *known);
  uint64_t *clocks[WEFT__MAX_LANES] = {0};
  bool ok = known != NULL;
  for (unsigned i = 0; i < WEFT__MAX_LANES && ok; i++)
    if (d->lane[i].ring != NULL) ok = (clocks[i] = weft__meta_calloc((size_t)d->lane[i].ring_size * ns, sizeof(uint64_t))) != NULL;
  if (!ok) {
    weft__meta_free(known);
    for (unsigned i = 0; i < WEFT__MAX_LANES; i++) weft__meta_free(clocks[i]);
    return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: no host memory for the process's stream clocks");
  }
  for (unsigned r = 0; r < d->n; r++) memcpy(&known[(size_t)r * ns], WEFT__ROW(d, r), d->n * sizeof *known);
  for (unsigned i = 0; i < WEFT__MAX_LANES; i++) {
    weft__lane_t *l = &d->lane[i];
    if (l->ring == NULL) continue;
    for (unsigned slot = 0; slot < l->ring_size; slot++)
      memcpy(&clocks[i][(size_t)slot * ns], &l->ring_clock[(size_t)slot * d->stride], d->n * sizeof(uint64_t));
    weft__meta_free(l->ring_clock);
    l->ring_clock = clocks[i];
  }
  weft__meta_free(d->known);
  d->known = known;
  d->stride = ns;
  return WEFT_OK;
}

void weft__clock_renew(weft__domain_t *d, unsigned at) {
  weft__lane_t *l = &d->lane[at];
  memset(WEFT__ROW(d, at), 0, d->stride * sizeof(uint64_t));
  if (l->ring != NULL) { /* a lane taken back with its events: what they implied is known now */
    memset(l->ring_tick, 0, l->ring_size * sizeof *l->ring_tick);
    memset(l->ring_clock, 0, (size_t)l->ring_size * d->stride * sizeof *l->ring_clock);
    memset(l->ring_use, 0, l->ring_size * sizeof *l->ring_use);
  }
  WEFT__ROW(d, at)[at] = l->tick;
  d->host_known[at] = l->tick;
  l->recorded = l->tick;
  l->dirty = l->deferred = l->eager = l->exact = false;
  l->joined = l->calm = 0;
  weft__clock_publish(d, at);
}

weft_status_t weft__clock_lanes_take(weft__tracker_t *tr, unsigned n) {
  weft__domain_t *d = &g_live;
  if (d->lane == NULL && !domain_alloc(d, WEFT__MAX_LANES, 0))
    return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: no host memory for the process's stream clocks");
  unsigned base = 0;
  for (unsigned run = 0; base + run < WEFT__MAX_LANES && run < n;) {
    if (g_used[base + run]) {
      base += run + 1;
      run = 0;
    } else {
      run++;
    }
  }
  if (base + n > WEFT__MAX_LANES)
    return weft__error(WEFT_ERR_BUSY, "weft: the process's %d stream lanes are taken by other runtimes (%u more "
                       "wanted: options.stream_count + adopt_streams)", WEFT__MAX_LANES, n);
  weft_status_t st = live_restride(d, base + n);
  if (st != WEFT_OK) return st;
  for (unsigned i = 0; i < n; i++) {
    unsigned at = base + i;
    g_used[at] = true;
    d->stream[at] = &tr->streams[i];
    weft__clock_renew(d, at); /* its last owner synchronised it */
  }
  atomic_fetch_add_explicit(&g_trackers, 1, memory_order_release);
  if (base + n > d->n) {
    d->n = base + n;
    atomic_store_explicit(&g_lanes, d->n, memory_order_release);
  }
  tr->live = d;
  tr->base = base;
  return WEFT_OK;
}

void weft__clock_lanes_give(weft__tracker_t *tr) {
  weft__domain_t *d = &g_live;
  for (unsigned i = 0; i < tr->n; i++) {
    unsigned at = tr->base + i;
    weft__lane_t *l = &d->lane[at];
    d->host_known[at] = l->tick;
    l->recorded = l->tick;
    l->dirty = l->deferred = l->eager = l->exact = false;
    l->joined = l->calm = 0;
    d->stream[at] = NULL;
    g_used[at] = false;
  }
  atomic_fetch_sub_explicit(&g_trackers, 1, memory_order_release);
}

/* The most events an exact lane's ring grows to (keep_room): past it, the oldest goes as on any
 * lane (a wait for it is served by a later event). 2^16 events: the host that far ahead of the
 * device is a program bug's sign, not a workload's. */
#define EXACT_RING_MAX 65536u

/* Doubles lane l's ring (an exact live lane's; the owner's context current): every recorded
 * event keeps its tick, snapshot and marks at its slot in the larger ring, new events fill the
 * rest. On failure nothing changed. */
static weft_status_t grow_ring(weft__tracker_t *own, weft__domain_t *d, weft__lane_t *l) {
  unsigned old = l->ring_size;
  weft__lane_t g = {.ring_size = old * 2}; /* the larger ring's arrays */
  g.ring = weft__meta_calloc(g.ring_size, sizeof *g.ring);
  g.ring_tick = weft__meta_calloc(g.ring_size, sizeof *g.ring_tick);
  g.ring_use = weft__meta_calloc(g.ring_size, sizeof *g.ring_use);
  g.ring_us = weft__meta_calloc(g.ring_size, sizeof *g.ring_us);
  g.ring_clock = weft__meta_calloc((size_t)g.ring_size * d->stride, sizeof *g.ring_clock);
  CUevent *fresh = weft__meta_calloc(old, sizeof *fresh);
  weft_status_t st = g.ring != NULL && g.ring_tick != NULL && g.ring_use != NULL && g.ring_us != NULL &&
                             g.ring_clock != NULL && fresh != NULL
                         ? WEFT_OK
                         : weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: no host memory to grow an event ring");
  /* Event creation needs the owner's context current; a record on a stream that names its
   * context (this ring's caller) does not bind it, and leaves the thread's context as it found
   * it: so the creation does too. */
  CUcontext before = NULL;
  bool restore = st == WEFT_OK && own->drv->cuCtxGetCurrent(&before) == CUDA_SUCCESS && before != own->ctx;
  if (st == WEFT_OK) st = weft__tracker_bind(own);
  unsigned made = 0;
  for (; st == WEFT_OK && made < old; made++) {
    CUresult r = own->drv->cuEventCreate(&fresh[made], CU_EVENT_DISABLE_TIMING);
    if (r != CUDA_SUCCESS) st = weft__driver_fail(r, "cuEventCreate");
  }
  if (restore) (void)own->drv->cuCtxSetCurrent(before); /* (weft__tracker_bind checks the driver's answer) */
  if (st != WEFT_OK) {
    for (unsigned i = 0; i + 1 < made; i++) (void)own->drv->cuEventDestroy(fresh[i]);
    ring_arrays_free(&g);
    weft__meta_free(fresh);
    return st;
  }
  /* Recorded events to their tick's slot; the never recorded ones, then the new ones, fill the
   * slots left (the ring's ticks are consecutive, so no two share a slot of the larger ring). */
  unsigned mask = g.ring_size - 1;
  for (unsigned i = 0; i < old; i++) {
    if (l->ring_tick[i] == 0) continue;
    unsigned j = (unsigned)(l->ring_tick[i] & mask);
    g.ring[j] = l->ring[i];
    g.ring_tick[j] = l->ring_tick[i];
    g.ring_use[j] = l->ring_use[i];
    g.ring_us[j] = l->ring_us[i];
    memcpy(&g.ring_clock[(size_t)j * d->stride], &l->ring_clock[(size_t)i * d->stride], d->n * sizeof(uint64_t));
  }
  unsigned j = 0;
  for (unsigned i = 0; i < old; i++) {
    if (l->ring_tick[i] != 0) continue;
    while (g.ring[j] != NULL) j++;
    g.ring[j] = l->ring[i];
  }
  for (unsigned f = 0; f < old; f++) {
    while (g.ring[j] != NULL) j++;
    g.ring[j] = fresh[f];
  }
  weft__meta_free(fresh);
  ring_arrays_free(l);
  l->ring = g.ring;
  l->ring_tick = g.ring_tick;
  l->ring_use = g.ring_use;
  l->ring_us = g.ring_us;
  l->ring_clock = g.ring_clock;
  l->ring_size = g.ring_size;
  own->counters.ring_growths++;
  return WEFT_OK;
}

/* Before an exact live lane records tick k: the slot k takes must not hold an event the host does
 * not know complete (weft__lane_t.exact). Complete, the host knows it (and every earlier tick:
 * stream order); still running, the ring grows. A query costs a microsecond or so, so the event
 * half a ring newer is asked first: complete, the host knows the next half ring's slots free too,
 * and a steady stream asks once per half ring. Owner's context current. */
static weft_status_t keep_room(weft__tracker_t *own, weft__domain_t *d, unsigned at, uint64_t k) {
  weft__lane_t *l = &d->lane[at];
  for (;;) {
    unsigned mask = l->ring_size - 1, slot = (unsigned)(k & mask);
    uint64_t old = l->ring_tick[slot];
    if (old == 0 || old <= d->host_known[at]) return WEFT_OK;
    uint64_t ahead = old + l->ring_size / 2; /* recorded: the ring holds (k - ring_size, k) */
    unsigned half = (unsigned)(ahead & mask);
    /* The queries relax this thread's capture mode: a live lane's events are no capture's, and
     * a GLOBAL capture this thread began elsewhere (another rank's, or code outside weft) would
     * refuse a plain query and be invalidated by it (CUDA_SEMANTICS.md). */
    CUresult r = CUDA_ERROR_NOT_READY;
    if (ahead < k && l->ring_tick[half] == ahead) WEFT__RELAXED(own->drv, r = own->drv->cuEventQuery(l->ring[half]));
    if (r == CUDA_SUCCESS) {
      d->host_known[at] = ahead;
      return WEFT_OK;
    }
    WEFT__RELAXED(own->drv, r = own->drv->cuEventQuery(l->ring[slot]));
    if (r == CUDA_SUCCESS) {
      d->host_known[at] = old;
      return WEFT_OK;
    }
    if (r != CUDA_ERROR_NOT_READY) return weft__driver_fail(r, "cuEventQuery");
    if (l->ring_size >= EXACT_RING_MAX) return WEFT_OK;
    weft_status_t st = grow_ring(own, d, l);
    if (st != WEFT_OK) return st;
  }
}

weft_status_t weft__clock_flush(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *s) {
  unsigned at = weft__at(d, s);
  weft__lane_t *l = &d->lane[at];
  if (l->recorded == l->tick) return WEFT_OK;
  /* s may be another runtime's stream (a use across devices needs its tick): its events and
   * its counters are its runtime's. The record needs no current context on a stream that names
   * its own; on a default stream (the legacy NULL stream means the current context's) it runs
   * in s's runtime's context, which stays current, and for another runtime's stream the
   * caller's is then made current again. */
  weft__tracker_t *own = s->tr;
  weft_status_t st = weft__lane_init(own, d, l);
  if (st != WEFT_OK) return st;
  bool away = own != tr && !weft__stream_names_context(s); /* another runtime's default stream */
  if ((st = weft__tracker_bind_for(own, s)) != WEFT_OK) return st;
  uint64_t k = l->tick;
  if (l->exact && d->capture == NULL && (st = keep_room(own, d, at, k)) != WEFT_OK) {
    if (away) (void)weft__tracker_bind(tr);
    return st;
  }
  unsigned slot = (unsigned)(k & (l->ring_size - 1));
  CUresult r = own->drv->cuEventRecord(l->ring[slot], s->raw);
  if (away) (void)weft__tracker_bind(tr);
  if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuEventRecord");
  memcpy(&l->ring_clock[(size_t)slot * d->stride], WEFT__ROW(d, at), d->n * sizeof(uint64_t));
  l->ring_tick[slot] = k;
  l->ring_use[slot] = l->last_use << 1 | (l->deferred && l->joined != 0);
  l->recorded = k;
  l->deferred = false;
  l->joined = 0;
  if (weft__trace_on()) l->ring_us[slot] = weft__trace_now_us();
  own->counters.events_recorded++;
  return WEFT_OK;
}

void weft__clock_needed(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *t, uint64_t k, bool newest) {
  weft__lane_t *l = &d->lane[weft__at(d, t)];
  /* Whether k's event covers (or, pending, will cover) several uses; an evicted slot's stand-in
   * is late anyway. */
  bool several = !newest && (k > l->recorded ? l->deferred && l->joined != 0 : (weft__clock_ring_use(l, k) & 1) != 0);
  if (several) {
    l->eager = true;
    l->calm = 0;
    tr->counters.late_waits++;
    return;
  }
  /* An eager lane's ticks cover one use each. A waiter needing the newest (k is the lane's last
   * tick) would have been served exactly by a deferred tick too; WEFT__CLOCK_CALM of those in a
   * row, and no older need between them, turn the lane lazy again. An exact lane stays eager. */
  if (l->eager && !l->exact && d->capture == NULL) {
    if (k < l->tick) l->calm = 0;
    else if (++l->calm >= WEFT__CLOCK_CALM) l->eager = false, l->calm = 0;
  }
}

weft_status_t weft__clock_record(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *s, uint64_t *tick) {
  *tick = weft__clock_pending_tick(d, weft__at(d, s));
  return weft__clock_flush(tr, d, s);
}

/* Whether code outside weft captures t now, as the driver says (an error counts as capturing:
 * the legacy stream while a blocking stream captures answers STREAM_CAPTURE_IMPLICIT, and a
 * record there would invalidate that capture too). */
static bool captured_outside(const weft_stream_t *t) {
  CUstreamCaptureStatus cs;
  return weft__capture_status(t, &cs, NULL) != CUDA_SUCCESS || cs != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* Records t's pending tick for another stream or the host. On an exposed live stream, code
 * outside weft may begin a capture at any moment: an event recorded into it would be captured,
 * asking the driver about it would invalidate the capture (CUDA_ERROR_CAPTURED_EVENT), and a wait
 * on it would pull the waiter into the capture. So the driver is asked before the record (a
 * capture under way: nothing is recorded) and after it (a capture begun meanwhile may hold the
 * event: the record is given up, its slot emptied, and the tick stays pending): CAPTURE either
 * way; the tick is recorded once the capture has ended. A weft call on t itself asked the driver
 * already (weft__stream_prepare): this is for everyone else, and costs two capture queries and an
 * event query once per pending point of an exposed stream. */
static weft_status_t record_for_others(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *t) {
  weft__lane_t *l = &d->lane[weft__at(d, t)];
  if (l->recorded == l->tick) return WEFT_OK;
  if (d->capture != NULL || !atomic_load_explicit(&t->exposed, memory_order_relaxed)) return weft__clock_flush(tr, d, t);
  /* A capture may even begin and end within the record (code outside weft capturing in a loop):
   * the driver then says no capture after it, but the event is the ended capture's, which the
   * driver refuses to wait on. With no capture under way a query of the event is safe, and tells
   * (INVALID_VALUE); the record is tried again then, three times in all. */
  for (int tries = 0; tries < 3; tries++) {
    bool captured = captured_outside(t);
    WEFT__TEST_POINT("clock: may record", t);
    if (captured) break;
    uint64_t was_recorded = l->recorded, was_joined = l->joined;
    bool was_deferred = l->deferred;
    weft_status_t st = weft__clock_flush(tr, d, t);
    if (st != WEFT_OK) return st;
    unsigned slot = (unsigned)(l->recorded & (l->ring_size - 1));
    captured = captured_outside(t);
    CUresult r = CUDA_SUCCESS;
    if (!captured) WEFT__RELAXED(t->tr->drv, r = t->tr->drv->cuEventQuery(l->ring[slot]));
    if (!captured && (r == CUDA_SUCCESS || r == CUDA_ERROR_NOT_READY)) return WEFT_OK;
    l->ring_tick[slot] = 0; /* its event may be the capture's */
    l->recorded = was_recorded;
    l->joined = was_joined;
    l->deferred = was_deferred;
    if (captured) break;
  }
  return WEFT_ERR_CAPTURE; /* (the caller says why: refused()) */
}

weft_status_t weft__clock_settle(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *t) {
  return record_for_others(tr, d, t);
}

/* record_for_others' refusal, said. */
static weft_status_t refused(const weft_stream_t *t) {
  return weft__error(WEFT_ERR_CAPTURE, "stream %u takes part in a capture begun outside weft: its newest point is "
                     "recorded once that capture has ended", t->index);
}

weft_status_t weft__clock_record_for_host(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *t, uint64_t *tick) {
  (void)weft__clock_pending_tick(d, weft__at(d, t));
  weft_status_t st = record_for_others(tr, d, t);
  *tick = d->lane[weft__at(d, t)].recorded;
  return st == WEFT_ERR_CAPTURE ? refused(t) : st;
}

weft_status_t weft__clock_slot(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *t, uint64_t k, unsigned *slot) {
  weft__lane_t *l = &d->lane[weft__at(d, t)];
  /* A busy lane's pending tick is its busy use's (tracker.h): nobody records it but that use,
   * and only an older tick is asked for here. */
  bool busy = d->capture == NULL && weft__lanes_atomic_has(&d->busy, weft__at(d, t));
  if (l->recorded != l->tick && !busy) { /* (record_for_others' own first test, without its call) */
    weft_status_t st = record_for_others(tr, d, t);
    if (st == WEFT_ERR_CAPTURE) /* k's event, where it exists, serves: only the pending tick waits */
      st = k <= l->recorded ? WEFT_OK : refused(t);
    if (st != WEFT_OK) return st;
  }
  unsigned mask = l->ring_size - 1;
  WEFT_ASSERT_INTERNAL(k >= 1 && k <= l->recorded);
  if (l->ring_tick[k & mask] == k) {
    *slot = (unsigned)(k & mask);
    return WEFT_OK;
  }
  /* Evicted: ticks (recorded - ring_size, recorded] are in the ring (every tick is recorded, in
   * order: a stream never skips one), except in a ring that grew (keep_room), whose older half
   * starts empty, and a slot whose record was given up (record_for_others): the oldest tick it
   * holds at or after k stands in (the recorded tick's own slot at least). */
  *slot = (unsigned)((l->recorded - l->ring_size + 1) & mask);
  if (l->ring_tick[*slot] < k) {
    uint64_t best = UINT64_MAX;
    for (unsigned i = 0; i <= mask; i++)
      if (l->ring_tick[i] >= k && l->ring_tick[i] < best) {
        best = l->ring_tick[i];
        *slot = i;
      }
    WEFT_ASSERT_INTERNAL(best != UINT64_MAX);
  }
  return WEFT_OK;
}

weft_status_t weft__clock_exact(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *s) {
  weft__lane_t *l = &d->lane[weft__at(d, s)];
  if (l->exact || d->capture != NULL) return WEFT_OK;
  /* (Not while s captures: the record would land in the capture.) */
  if (l->tick != l->recorded && !atomic_load_explicit(&s->exposed, memory_order_relaxed) &&
      atomic_load_explicit(&s->capture, memory_order_relaxed) == NULL) {
    weft_status_t st = weft__clock_flush(tr, d, s);
    if (st != WEFT_OK) return st;
  }
  l->exact = l->eager = true;
  atomic_store_explicit(&s->exact, true, memory_order_release);
  return WEFT_OK;
}

/* A wait's trace slice and NVTX mark, out of the wait's own code (both are off in the common
 * case). */
static __attribute__((noinline, cold)) void note_wait(weft__tracker_t *tr, const weft__domain_t *d,
                                                     const weft_stream_t *s, const weft_stream_t *t, unsigned slot) {
  const weft__lane_t *lt = &d->lane[weft__at(d, t)];
  if (weft__trace_on()) {
    uint64_t id = d->capture != NULL ? d->capture->id : 0;
    weft__trace_wait(tr->ordinal, weft__trace_tid(t->index, id), lt->ring_us[slot], weft__trace_tid(s->index, id));
  }
  if (weft__nvtx_on()) {
    char m[112];
    snprintf(m, sizeof m, "weft wait: stream %u waits for stream %u of device %d (tick %llu)", s->index, t->index,
             t->tr->ordinal, (unsigned long long)lt->ring_tick[slot]);
    weft__nvtx_mark(m);
  }
}

weft_status_t weft__clock_wait_at(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *s, weft_stream_t *t,
                                  uint64_t k, unsigned slot) {
  unsigned as = weft__at(d, s), at = weft__at(d, t);
  /* Waiting for an exact lane makes s exact too: its later work waits for that lane's. */
  if (__builtin_expect(d->lane[at].exact, 0)) {
    weft_status_t st = weft__clock_exact(tr, d, s);
    if (st != WEFT_OK) return st;
  }
  const weft__lane_t *lt = &d->lane[at];
  CUresult r = tr->drv->cuStreamWaitEvent(s->raw, lt->ring[slot], 0);
  if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuStreamWaitEvent");
  if (lt->ring_tick[slot] != k) tr->counters.ring_evictions++; /* a newer event stood in */
  uint64_t *row = WEFT__ROW(d, as);
  const uint64_t *snap = &lt->ring_clock[(size_t)slot * d->stride];
  /* A few lanes: a plain loop is shorter code than the vectorised one and as fast. */
#pragma GCC unroll 1
  for (unsigned u = 0; u < d->n; u++)
    if (snap[u] > row[u]) row[u] = snap[u];
  row[at] = weft__max_u64(row[at], lt->ring_tick[slot]);
  row[as] = d->lane[as].tick; /* own entry is always the own tick */
  d->lane[as].dirty = true;
  weft__clock_publish(d, as);
  tr->counters.waits_issued++;
  if (__builtin_expect(weft__trace_on() || weft__nvtx_on(), 0)) note_wait(tr, d, s, t, slot);
  return WEFT_OK;
}

weft_status_t weft__clock_wait(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *s, weft_stream_t *t, uint64_t k) {
  unsigned slot;
  weft_status_t st = weft__clock_slot(tr, d, t, k, &slot);
  return st == WEFT_OK ? weft__clock_wait_at(tr, d, s, t, k, slot) : st;
}
