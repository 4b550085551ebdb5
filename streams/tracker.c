/* The access tracker: vector clocks over pool streams (see tracker.h for the model).
 *
 * Everything here runs under tr->lock except the blocking host synchronisations, which copy what
 * they need under the lock, wait without it, and merge the result back under it. */
#include <string.h>

#include "lib/core/debug.h"
#include "lib/core/error.h"
#include "lib/core/meta.h"
#include "streams/tracker.h"

#define ROW(d, s) (&(d)->known[(size_t)(s) * (d)->n])

/* The domain a use on s belongs to: its capture's, or the live one. */
static inline weft__domain_t *dom_of(weft__tracker_t *tr, const weft_stream_t *s) {
  return s->capture != NULL ? &s->capture->dom : &tr->live;
}

/* Capture domains create their events on first use: most captures touch few streams. */
weft_status_t weft__lane_init(weft__tracker_t *tr, weft__domain_t *d, weft__lane_t *l) {
  if (l->ring != NULL) return WEFT_OK;
  l->ring = weft__meta_calloc(d->ring_size, sizeof *l->ring);
  l->ring_tick = weft__meta_calloc(d->ring_size, sizeof *l->ring_tick);
  l->ring_clock = weft__meta_calloc((size_t)d->ring_size * d->n, sizeof *l->ring_clock);
  if (l->ring == NULL || l->ring_tick == NULL || l->ring_clock == NULL) goto oom;
  for (unsigned i = 0; i < d->ring_size; i++) {
    CUresult r = tr->drv->cuEventCreate(&l->ring[i], CU_EVENT_DISABLE_TIMING);
    if (r != CUDA_SUCCESS) {
      l->ring[i] = NULL;
      weft__lane_free(tr, d, l);
      return weft__driver_fail(r, "cuEventCreate");
    }
  }
  return WEFT_OK;
oom:
  weft__lane_free(tr, d, l);
  return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: no host memory for an event ring");
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

void weft__domain_free(weft__tracker_t *tr, weft__domain_t *d) {
  for (unsigned i = 0; i < d->n; i++) weft__lane_free(tr, d, &d->lane[i]);
  weft__meta_free(d->known);
  weft__meta_free(d->host_known);
  memset(d, 0, sizeof *d);
}

void weft__lane_free(weft__tracker_t *tr, weft__domain_t *d, weft__lane_t *l) {
  if (l->ring != NULL)
    for (unsigned i = 0; i < d->ring_size; i++)
      if (l->ring[i] != NULL) tr->drv->cuEventDestroy(l->ring[i]);
  weft__meta_free(l->ring);
  weft__meta_free(l->ring_tick);
  weft__meta_free(l->ring_clock);
  memset(l, 0, sizeof *l);
}

static inline void lock(weft__tracker_t *tr) { pthread_mutex_lock(&tr->lock); }
static inline void unlock(weft__tracker_t *tr) { pthread_mutex_unlock(&tr->lock); }

static inline uint64_t max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }

/* Work enqueued on s from now on is ordered after (t, k), or the host saw it complete. */
static inline bool implied(const weft__domain_t *d, unsigned s, unsigned t, uint64_t k) {
  return k == 0 || s == t || ROW(d, s)[t] >= k || d->host_known[t] >= k;
}

/* Records the event of s's pending tick (handed out by weft__tracker_point while s was dirty).
 * Called before anything else is enqueued on s, so the event sits exactly at the point. */
static weft_status_t flush_pending(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *s) {
  weft__lane_t *l = &d->lane[s->index];
  if (l->recorded == l->tick) return WEFT_OK;
  weft_status_t st = weft__lane_init(tr, d, l);
  if (st != WEFT_OK) return st;
  uint64_t k = l->tick;
  unsigned slot = (unsigned)(k & (d->ring_size - 1));
  CUresult r = tr->drv->cuEventRecord(l->ring[slot], s->raw);
  if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuEventRecord");
  memcpy(&l->ring_clock[(size_t)slot * d->n], ROW(d, s->index), d->n * sizeof(uint64_t));
  l->ring_tick[slot] = k;
  l->recorded = k;
  tr->counters.events_recorded++;
  return WEFT_OK;
}

/* The ring slot of the oldest recorded tick >= k on stream t (k <= tick). With k evicted, a
 * newer event stands in: waiting on it is later than needed but never wrong. */
static weft_status_t slot_for(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *t, uint64_t k, unsigned *slot) {
  weft_status_t st = flush_pending(tr, d, t);
  if (st != WEFT_OK) return st;
  weft__lane_t *l = &d->lane[t->index];
  unsigned mask = d->ring_size - 1;
  if (l->ring_tick[k & mask] == k) {
    *slot = (unsigned)(k & mask);
    return WEFT_OK;
  }
  /* Evicted: ticks (recorded - ring_size, recorded] are in the ring. */
  WEFT_ASSERT_INTERNAL(k + d->ring_size <= l->recorded);
  uint64_t oldest = l->recorded - d->ring_size + 1;
  *slot = (unsigned)(oldest & mask);
  tr->counters.ring_evictions++;
  return WEFT_OK;
}

/* Makes s wait for (t, k) through the ring and merges the event's clock into s's row. */
static weft_status_t wait_on(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *s, weft_stream_t *t, uint64_t k) {
  unsigned slot;
  weft_status_t st = slot_for(tr, d, t, k, &slot);
  if (st != WEFT_OK) return st;
  const weft__lane_t *lt = &d->lane[t->index];
  CUresult r = tr->drv->cuStreamWaitEvent(s->raw, lt->ring[slot], 0);
  if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuStreamWaitEvent");
  uint64_t *row = ROW(d, s->index);
  const uint64_t *snap = &lt->ring_clock[(size_t)slot * d->n];
  for (unsigned u = 0; u < d->n; u++) row[u] = max_u64(row[u], snap[u]);
  row[t->index] = max_u64(row[t->index], lt->ring_tick[slot]);
  row[s->index] = d->lane[s->index].tick; /* own entry is always the own tick */
  d->lane[s->index].dirty = true;
  tr->counters.waits_issued++;
  return WEFT_OK;
}

void weft__access_init(weft__access_state_t *st, uint64_t *reads, weft__point_t alloc_point) {
  st->write = alloc_point;
  st->reader_mask = 0;
  st->reads = reads;
}

/* The histories the uses of s act on: the live ones, or inside a capture their capture-local
 * records (created on first touch; that also builds the capture's access summary). Writes the
 * translated uses into `out` (room for n). */
static weft_status_t translate(weft__tracker_t *tr, weft_stream_t *s, const weft__use_t *uses, size_t n,
                               weft__use_t *out, bool note_kinds) {
  weft__capture_t *c = s->capture;
  for (size_t i = 0; i < n; i++) {
    out[i].kind = uses[i].kind;
    if (c == NULL) {
      out[i].state = uses[i].state;
      continue;
    }
    weft__capture_block_t *b = weft__capture_block(c, uses[i].state, false);
    if (b == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: no host memory for a capture record");
    if (note_kinds) b->kind |= uses[i].kind;
    out[i].state = &b->local;
  }
  (void)tr;
  return WEFT_OK;
}

/* need[t]: the newest tick of t that the uses conflict with and that is not yet implied for s.
 * Returns a bit mask of the streams with a need. */
static uint64_t collect_needs(weft__tracker_t *tr, const weft__domain_t *d, unsigned s, const weft__use_t *uses,
                              size_t n, uint64_t *need) {
  uint64_t mask = 0;
  for (size_t i = 0; i < n; i++) {
    const weft__access_state_t *st = uses[i].state;
    weft__point_t w = st->write;
    if (w.tick != 0 && w.stream != s) {
      if (!implied(d, s, w.stream, w.tick)) {
        need[w.stream] = max_u64(need[w.stream], w.tick);
        mask |= 1ull << w.stream;
      } else {
        tr->counters.waits_skipped++;
        if (ROW(d, s)[w.stream] < w.tick) tr->counters.waits_host_known++;
      }
    }
    if (!(uses[i].kind & WEFT_WRITE)) continue;
    for (uint64_t m = st->reader_mask & ~(1ull << s); m != 0; m &= m - 1) {
      unsigned t = (unsigned)__builtin_ctzll(m);
      uint64_t k = st->reads[t];
      if (!implied(d, s, t, k)) {
        need[t] = max_u64(need[t], k);
        mask |= 1ull << t;
      } else {
        tr->counters.waits_skipped++;
        if (ROW(d, s)[t] < k) tr->counters.waits_host_known++;
      }
    }
  }
  return mask;
}

/* Issues the waits for `mask`/`need`, dropping every need implied by another kept one: what is
 * left is the set of maximal conflicting points, one wait each. */
static weft_status_t issue_waits(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *s, uint64_t mask,
                                 uint64_t *need) {
  if (mask == 0 || tr->no_waits) return WEFT_OK;
  /* Resolve each need to its ring slot and snapshot first. */
  unsigned slot[WEFT__MAX_STREAMS];
  for (uint64_t m = mask; m != 0; m &= m - 1) {
    unsigned t = (unsigned)__builtin_ctzll(m);
    weft_status_t st = slot_for(tr, d, &tr->streams[t], need[t], &slot[t]);
    if (st != WEFT_OK) return st;
  }
  uint64_t kept = mask;
  for (uint64_t m = mask; m != 0; m &= m - 1) {
    unsigned t = (unsigned)__builtin_ctzll(m);
    for (uint64_t o = kept & ~(1ull << t); o != 0; o &= o - 1) {
      unsigned u = (unsigned)__builtin_ctzll(o);
      const uint64_t *snap = &d->lane[u].ring_clock[(size_t)slot[u] * d->n];
      if (snap[t] >= need[t]) {
        kept &= ~(1ull << t);
        tr->counters.waits_skipped++;
        break;
      }
    }
  }
  for (uint64_t m = kept; m != 0; m &= m - 1) {
    unsigned t = (unsigned)__builtin_ctzll(m);
    weft_status_t st = wait_on(tr, d, s, &tr->streams[t], need[t]);
    if (st != WEFT_OK) return st;
  }
  return WEFT_OK;
}

static weft_status_t begin_locked(weft__tracker_t *tr, weft_stream_t *s, const weft__use_t *uses, size_t n) {
  weft__domain_t *d = dom_of(tr, s);
  weft_status_t st = flush_pending(tr, d, s);
  if (st != WEFT_OK) return st;
  uint64_t need[WEFT__MAX_STREAMS];
  memset(need, 0, d->n * sizeof need[0]);
  uint64_t mask = collect_needs(tr, d, s->index, uses, n, need);
  return issue_waits(tr, d, s, mask, need);
}

static weft_status_t end_locked(weft__tracker_t *tr, weft_stream_t *s, const weft__use_t *uses, size_t n) {
  weft__domain_t *d = dom_of(tr, s);
  weft__lane_t *l = &d->lane[s->index];
  weft_status_t st = flush_pending(tr, d, s);
  if (st == WEFT_OK) st = weft__lane_init(tr, d, l);
  if (st != WEFT_OK) return st;
  uint64_t k = l->tick + 1;
  unsigned slot = (unsigned)(k & (d->ring_size - 1));
  CUresult r = tr->drv->cuEventRecord(l->ring[slot], s->raw);
  if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuEventRecord");
  l->tick = k;
  l->recorded = k;
  l->dirty = false;
  uint64_t *row = ROW(d, s->index);
  row[s->index] = k;
  memcpy(&l->ring_clock[(size_t)slot * d->n], row, d->n * sizeof(uint64_t));
  l->ring_tick[slot] = k;
  tr->counters.events_recorded++;
  for (size_t i = 0; i < n; i++) {
    weft__access_state_t *a = uses[i].state;
    if (uses[i].kind & WEFT_WRITE) {
      a->write.stream = s->index;
      a->write.tick = k;
      a->reader_mask = 0;
    } else {
      a->reads[s->index] = k;
      a->reader_mask |= 1ull << s->index;
    }
  }
  tr->counters.uses++;
  tr->counters.accesses += n;
  s->last_used = ++tr->use_seq;
  return WEFT_OK;
}

#define SMALL_USES 32

/* Runs `body` with the uses translated to s's domain (on the stack when few). */
static weft_status_t with_domain_uses(weft__tracker_t *tr, weft_stream_t *s, const weft__use_t *uses, size_t n,
                                      bool note_kinds, weft__use_t **out, weft__use_t *small) {
  if (s->capture == NULL) {
    *out = (weft__use_t *)uses;
    return WEFT_OK;
  }
  *out = n <= SMALL_USES ? small : weft__meta_alloc(n * sizeof **out);
  if (*out == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft: no host memory for %zu accesses", n);
  weft_status_t st = translate(tr, s, uses, n, *out, note_kinds);
  if (st != WEFT_OK && *out != small) weft__meta_free(*out);
  return st;
}

static void done_domain_uses(const weft__use_t *uses, weft__use_t *t, weft__use_t *small) {
  if (t != uses && t != small) weft__meta_free(t);
}

/* The three ways in: waits only, record only, or both around `fn` (under one lock hold). */
enum { DO_BEGIN = 1, DO_END = 2 };

static weft_status_t run_use(weft_stream_t *s, const weft__use_t *uses, size_t n, unsigned what,
                             weft_status_t (*fn)(weft_stream_t *s, void *arg), void *arg) {
  weft__tracker_t *tr = s->tr;
  weft__use_t small[SMALL_USES], *du;
  lock(tr);
  /* Kinds go into a capture's access summary once, when the use begins. */
  weft_status_t st = with_domain_uses(tr, s, uses, n, (what & DO_BEGIN) != 0, &du, small);
  if (st == WEFT_OK) {
    if (what & DO_BEGIN) st = begin_locked(tr, s, du, n);
    if (st == WEFT_OK && fn != NULL) st = fn(s, arg);
    if (st == WEFT_OK && (what & DO_END)) st = end_locked(tr, s, du, n);
    done_domain_uses(uses, du, small);
  }
  unlock(tr);
  return st;
}

weft_status_t weft__tracker_begin(weft_stream_t *s, const weft__use_t *uses, size_t n) {
  return run_use(s, uses, n, DO_BEGIN, NULL, NULL);
}

weft_status_t weft__tracker_end(weft_stream_t *s, const weft__use_t *uses, size_t n) {
  return run_use(s, uses, n, DO_END, NULL, NULL);
}

weft_status_t weft__tracker_use(weft_stream_t *s, const weft__use_t *uses, size_t n,
                                weft_status_t (*fn)(weft_stream_t *s, void *arg), void *arg) {
  return run_use(s, uses, n, DO_BEGIN | DO_END, fn, arg);
}

static weft__point_t point_locked(weft__tracker_t *tr, weft_stream_t *s) {
  weft__domain_t *d = dom_of(tr, s);
  weft__lane_t *l = &d->lane[s->index];
  if (l->dirty) {
    l->tick++;
    ROW(d, s->index)[s->index] = l->tick;
    l->dirty = false; /* the event is recorded at the next flush_pending */
  }
  return (weft__point_t){s->index, l->tick};
}

weft__point_t weft__tracker_point(weft_stream_t *s) {
  lock(s->tr);
  weft__point_t p = point_locked(s->tr, s);
  unlock(s->tr);
  return p;
}

bool weft__tracker_is_ordered(weft_stream_t *s, weft__point_t p) {
  weft__tracker_t *tr = s->tr;
  lock(tr);
  bool ok = p.stream >= tr->n || implied(dom_of(tr, s), s->index, p.stream, p.tick);
  unlock(tr);
  return ok;
}

weft_status_t weft__tracker_order(weft_stream_t *s, weft__point_t p) {
  weft__tracker_t *tr = s->tr;
  weft_status_t st = WEFT_OK;
  lock(tr);
  weft__domain_t *d = dom_of(tr, s);
  if (p.stream < tr->n && !implied(d, s->index, p.stream, p.tick)) {
    st = flush_pending(tr, d, s);
    if (st == WEFT_OK) st = wait_on(tr, d, s, &tr->streams[p.stream], p.tick);
  }
  unlock(tr);
  return st;
}

/* The host saw (t, slot's tick) complete: so is everything in that event's clock. */
static void learn_complete(weft__tracker_t *tr, unsigned t, const uint64_t *snap, uint64_t tick) {
  weft__domain_t *d = &tr->live;
  for (unsigned u = 0; u < d->n; u++) d->host_known[u] = max_u64(d->host_known[u], snap[u]);
  d->host_known[t] = max_u64(d->host_known[t], tick);
}

/* Points are live-domain points here: the pool and block syncs only ask about live work. */
bool weft__tracker_poll(weft__tracker_t *tr, weft__point_t p) {
  if (p.tick == 0) return true;
  bool done = false;
  lock(tr);
  weft__domain_t *d = &tr->live;
  if (p.stream < d->n && d->host_known[p.stream] >= p.tick) {
    done = true;
  } else if (p.stream < d->n && !weft__capture_blocks_housekeeping(tr)) {
    /* A query under a GLOBAL capture would invalidate it: then the answer is "not known". */
    weft_stream_t *t = &tr->streams[p.stream];
    unsigned slot;
    if (slot_for(tr, d, t, p.tick, &slot) == WEFT_OK &&
        tr->drv->cuEventQuery(d->lane[p.stream].ring[slot]) == CUDA_SUCCESS) {
      learn_complete(tr, p.stream, &d->lane[p.stream].ring_clock[(size_t)slot * d->n], d->lane[p.stream].ring_tick[slot]);
      done = true;
    }
  }
  unlock(tr);
  return done;
}

size_t weft__tracker_conflicts(weft__tracker_t *tr, const weft__access_state_t *st, unsigned kind, weft__point_t *out) {
  size_t c = 0;
  lock(tr);
  if (st->write.tick != 0) out[c++] = st->write;
  if (kind & WEFT_WRITE)
    for (uint64_t m = st->reader_mask; m != 0; m &= m - 1) {
      unsigned t = (unsigned)__builtin_ctzll(m);
      out[c++] = (weft__point_t){t, st->reads[t]};
    }
  unlock(tr);
  return c;
}

static weft_status_t refuse_under_capture(weft__tracker_t *tr, const char *what) {
  return weft__error(WEFT_ERR_CAPTURE, "%s: not allowed while a capture that could see it is active", what);
}

/* Blocks on the point's event without the lock, then records the host's knowledge. */
weft_status_t weft__tracker_sync_points(weft__tracker_t *tr, const weft__point_t *pts, size_t n) {
  weft__domain_t *d = &tr->live;
  if (tr->captures != 0) weft__capture_refresh(tr);
  for (size_t i = 0; i < n; i++) {
    weft__point_t p = pts[i];
    if (p.tick == 0 || p.stream >= d->n) continue;
    uint64_t snap[WEFT__MAX_STREAMS];
    lock(tr);
    if (d->host_known[p.stream] >= p.tick) {
      unlock(tr);
      continue;
    }
    if (weft__capture_blocks_housekeeping(tr)) {
      unlock(tr);
      return refuse_under_capture(tr, "synchronising a block");
    }
    weft_stream_t *t = &tr->streams[p.stream];
    unsigned slot;
    weft_status_t st = slot_for(tr, d, t, p.tick, &slot);
    if (st != WEFT_OK) {
      unlock(tr);
      return st;
    }
    /* Copy the clock now: the slot may be re-recorded once the lock is dropped; the event we
     * then wait for is newer and covers this snapshot. */
    const weft__lane_t *l = &d->lane[p.stream];
    memcpy(snap, &l->ring_clock[(size_t)slot * d->n], d->n * sizeof(uint64_t));
    uint64_t tick = l->ring_tick[slot];
    CUevent ev = l->ring[slot];
    unlock(tr);
    CUresult r = tr->drv->cuEventSynchronize(ev);
    if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuEventSynchronize");
    lock(tr);
    learn_complete(tr, p.stream, snap, tick);
    unlock(tr);
  }
  return WEFT_OK;
}

/* Shared by sync and query: run `wait` on the raw stream, then learn everything s had enqueued
 * when we looked. */
static weft_status_t host_wait_stream(weft_stream_t *s, bool blocking) {
  weft__tracker_t *tr = s->tr;
  weft__domain_t *d = &tr->live;
  uint64_t snap[WEFT__MAX_STREAMS];
  if (tr->captures != 0) weft__capture_refresh(tr);
  lock(tr);
  if (s->capture != NULL || weft__capture_blocks_housekeeping(tr)) {
    unlock(tr);
    return refuse_under_capture(tr, blocking ? "weft_stream_synchronize" : "weft_stream_query");
  }
  memcpy(snap, ROW(d, s->index), d->n * sizeof(uint64_t));
  uint64_t tick = d->lane[s->index].tick;
  unlock(tr);
  CUresult r = blocking ? tr->drv->cuStreamSynchronize(s->raw) : tr->drv->cuStreamQuery(s->raw);
  if (r != CUDA_SUCCESS) return weft__driver_fail(r, blocking ? "cuStreamSynchronize" : "cuStreamQuery");
  lock(tr);
  learn_complete(tr, s->index, snap, tick);
  unlock(tr);
  return WEFT_OK;
}

weft_status_t weft__tracker_sync_stream(weft_stream_t *s) { return host_wait_stream(s, true); }
weft_status_t weft__tracker_query_stream(weft_stream_t *s) { return host_wait_stream(s, false); }

weft_status_t weft__tracker_sync_all(weft__tracker_t *tr) {
  for (unsigned i = 0; i < tr->n; i++) {
    weft_status_t st = weft__tracker_sync_stream(&tr->streams[i]);
    if (st != WEFT_OK) return st;
  }
  return WEFT_OK;
}

weft_stream_t *weft__tracker_auto(weft__tracker_t *tr, bool high, const weft__use_t *uses, size_t n) {
  lock(tr);
  weft_stream_t *best = NULL;
  unsigned best_waits = ~0u;
  unsigned first = high ? tr->n - tr->n_high : 0, last = high ? tr->n : tr->n - tr->n_high;
  uint64_t need[WEFT__MAX_STREAMS];
  uint64_t skipped = tr->counters.waits_skipped, host = tr->counters.waits_host_known;
  for (unsigned c = first; c < last; c++) {
    weft_stream_t *s = &tr->streams[c];
    if (s->capture != NULL) continue; /* a capturing stream is not free for eager work */
    memset(need, 0, tr->n * sizeof need[0]);
    unsigned waits = (unsigned)__builtin_popcountll(collect_needs(tr, &tr->live, c, uses, n, need));
    if (best == NULL || waits < best_waits || (waits == best_waits && s->last_used < best->last_used)) {
      best = s;
      best_waits = waits;
    }
  }
  /* collect_needs counted skips for every candidate: only the chosen use will count them. */
  tr->counters.waits_skipped = skipped;
  tr->counters.waits_host_known = host;
  unlock(tr);
  return best;
}

void weft__tracker_touch(weft_stream_t *s) {
  lock(s->tr);
  dom_of(s->tr, s)->lane[s->index].dirty = true;
  unlock(s->tr);
}

weft_status_t weft__tracker_import_event(weft_stream_t *s, CUevent ev) {
  weft__tracker_t *tr = s->tr;
  lock(tr);
  weft__domain_t *d = dom_of(tr, s);
  weft_status_t st = flush_pending(tr, d, s);
  if (st == WEFT_OK) {
    /* Inside a capture, an event recorded outside it is waited on as an external dependency. */
    unsigned flags = s->capture != NULL ? CU_EVENT_WAIT_EXTERNAL : 0;
    CUresult r = tr->drv->cuStreamWaitEvent(s->raw, ev, flags);
    if (r != CUDA_SUCCESS) st = weft__driver_fail(r, "cuStreamWaitEvent");
    else d->lane[s->index].dirty = true;
  }
  unlock(tr);
  return st;
}

static bool domain_is_valid(weft__tracker_t *tr, const weft__domain_t *d) {
  bool ok = true;
  for (unsigned s = 0; s < d->n && ok; s++) {
    const weft__lane_t *l = &d->lane[s];
    const uint64_t *row = ROW(d, s);
    if (row[s] != l->tick) ok = weft__debug_report("tracker", "known[s][s] != tick[s]");
    if (l->recorded > l->tick) ok = weft__debug_report("tracker", "recorded tick beyond tick");
    if (l->tick - l->recorded > 1) ok = weft__debug_report("tracker", "more than one pending tick");
    for (unsigned t = 0; t < d->n && ok; t++) {
      if (row[t] > d->lane[t].tick) ok = weft__debug_report("tracker", "known beyond the other stream's tick");
      if (d->host_known[t] > d->lane[t].tick) ok = weft__debug_report("tracker", "host knows a future tick");
    }
    if (l->ring_tick == NULL) continue;
    for (unsigned slot = 0; slot < d->ring_size && ok; slot++) {
      if (l->ring_tick[slot] == 0) continue;
      if (l->ring_tick[slot] > l->recorded) ok = weft__debug_report("tracker", "ring slot newer than recorded");
      const uint64_t *snap = &l->ring_clock[(size_t)slot * d->n];
      for (unsigned t = 0; t < d->n && ok; t++)
        if (snap[t] > row[t]) ok = weft__debug_report("tracker", "ring snapshot ahead of the stream's row");
    }
  }
  (void)tr;
  return ok;
}

bool weft__tracker_is_valid(weft__tracker_t *tr) {
  lock(tr);
  bool ok = domain_is_valid(tr, &tr->live);
  for (unsigned s = 0; s < tr->n && ok; s++)
    if (tr->streams[s].capture != NULL && tr->streams[s].capture->origin == &tr->streams[s])
      ok = domain_is_valid(tr, &tr->streams[s].capture->dom);
  unlock(tr);
  return ok;
}
