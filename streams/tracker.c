/* The access tracker: vector clocks over pool streams (see tracker.h for the model).
 *
 * Everything here runs under tr->lock except the blocking host synchronisations, which copy what
 * they need under the lock, wait without it, and merge the result back under it. */
#include <string.h>

#include "lib/core/debug.h"
#include "lib/core/error.h"
#include "lib/core/meta.h"
#include "streams/tracker.h"

#define ROW(tr, s) (&(tr)->known[(size_t)(s) * (tr)->n])

static inline void lock(weft__tracker_t *tr) { pthread_mutex_lock(&tr->lock); }
static inline void unlock(weft__tracker_t *tr) { pthread_mutex_unlock(&tr->lock); }

static inline uint64_t max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }

/* Work enqueued on s from now on is ordered after (t, k), or the host saw it complete. */
static inline bool implied(const weft__tracker_t *tr, unsigned s, unsigned t, uint64_t k) {
  return k == 0 || s == t || ROW(tr, s)[t] >= k || tr->host_known[t] >= k;
}

/* Records the event of s's pending tick (handed out by weft__tracker_point while s was dirty).
 * Called before anything else is enqueued on s, so the event sits exactly at the point. */
static weft_status_t flush_pending(weft__tracker_t *tr, weft_stream_t *s) {
  if (s->recorded == s->tick) return WEFT_OK;
  uint64_t k = s->tick;
  unsigned slot = (unsigned)(k & (tr->ring_size - 1));
  CUresult r = tr->drv->cuEventRecord(s->ring[slot], s->raw);
  if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuEventRecord");
  memcpy(&s->ring_clock[(size_t)slot * tr->n], ROW(tr, s->index), tr->n * sizeof(uint64_t));
  s->ring_tick[slot] = k;
  s->recorded = k;
  tr->counters.events_recorded++;
  return WEFT_OK;
}

/* The ring slot of the oldest recorded tick >= k on stream t (k <= t->tick). With k evicted, a
 * newer event stands in: waiting on it is later than needed but never wrong. */
static weft_status_t slot_for(weft__tracker_t *tr, weft_stream_t *t, uint64_t k, unsigned *slot) {
  weft_status_t st = flush_pending(tr, t);
  if (st != WEFT_OK) return st;
  unsigned mask = tr->ring_size - 1;
  if (t->ring_tick[k & mask] == k) {
    *slot = (unsigned)(k & mask);
    return WEFT_OK;
  }
  /* Evicted: ticks (recorded - ring_size, recorded] are in the ring. */
  WEFT_ASSERT_INTERNAL(k + tr->ring_size <= t->recorded);
  uint64_t oldest = t->recorded - tr->ring_size + 1;
  *slot = (unsigned)(oldest & mask);
  tr->counters.ring_evictions++;
  return WEFT_OK;
}

/* Makes s wait for (t, k) through the ring and merges the event's clock into s's row. */
static weft_status_t wait_on(weft__tracker_t *tr, weft_stream_t *s, weft_stream_t *t, uint64_t k) {
  unsigned slot;
  weft_status_t st = slot_for(tr, t, k, &slot);
  if (st != WEFT_OK) return st;
  CUresult r = tr->drv->cuStreamWaitEvent(s->raw, t->ring[slot], 0);
  if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuStreamWaitEvent");
  uint64_t *row = ROW(tr, s->index);
  const uint64_t *snap = &t->ring_clock[(size_t)slot * tr->n];
  for (unsigned u = 0; u < tr->n; u++) row[u] = max_u64(row[u], snap[u]);
  row[t->index] = max_u64(row[t->index], t->ring_tick[slot]);
  row[s->index] = s->tick; /* own entry is always the own tick */
  s->dirty = true;
  tr->counters.waits_issued++;
  return WEFT_OK;
}

void weft__access_init(weft__access_state_t *st, uint64_t *reads, weft__point_t alloc_point) {
  st->write = alloc_point;
  st->reader_mask = 0;
  st->reads = reads;
}

/* need[t]: the newest tick of t that the uses conflict with and that is not yet implied for s.
 * Returns a bit mask of the streams with a need. */
static uint64_t collect_needs(weft__tracker_t *tr, unsigned s, const weft__use_t *uses, size_t n, uint64_t *need) {
  uint64_t mask = 0;
  for (size_t i = 0; i < n; i++) {
    const weft__access_state_t *st = uses[i].state;
    weft__point_t w = st->write;
    if (w.tick != 0 && w.stream != s) {
      if (!implied(tr, s, w.stream, w.tick)) {
        need[w.stream] = max_u64(need[w.stream], w.tick);
        mask |= 1ull << w.stream;
      } else {
        tr->counters.waits_skipped++;
        if (ROW(tr, s)[w.stream] < w.tick) tr->counters.waits_host_known++;
      }
    }
    if (!(uses[i].kind & WEFT_WRITE)) continue;
    for (uint64_t m = st->reader_mask & ~(1ull << s); m != 0; m &= m - 1) {
      unsigned t = (unsigned)__builtin_ctzll(m);
      uint64_t k = st->reads[t];
      if (!implied(tr, s, t, k)) {
        need[t] = max_u64(need[t], k);
        mask |= 1ull << t;
      } else {
        tr->counters.waits_skipped++;
        if (ROW(tr, s)[t] < k) tr->counters.waits_host_known++;
      }
    }
  }
  return mask;
}

/* Issues the waits for `mask`/`need`, dropping every need implied by another kept one: what is
 * left is the set of maximal conflicting points, one wait each. */
static weft_status_t issue_waits(weft__tracker_t *tr, weft_stream_t *s, uint64_t mask, uint64_t *need) {
  if (mask == 0 || tr->no_waits) return WEFT_OK;
  /* Resolve each need to its ring slot and snapshot first. */
  unsigned slot[WEFT__MAX_STREAMS];
  for (uint64_t m = mask; m != 0; m &= m - 1) {
    unsigned t = (unsigned)__builtin_ctzll(m);
    weft_status_t st = slot_for(tr, &tr->streams[t], need[t], &slot[t]);
    if (st != WEFT_OK) return st;
  }
  uint64_t kept = mask;
  for (uint64_t m = mask; m != 0; m &= m - 1) {
    unsigned t = (unsigned)__builtin_ctzll(m);
    for (uint64_t o = kept & ~(1ull << t); o != 0; o &= o - 1) {
      unsigned u = (unsigned)__builtin_ctzll(o);
      const uint64_t *snap = &tr->streams[u].ring_clock[(size_t)slot[u] * tr->n];
      if (snap[t] >= need[t]) {
        kept &= ~(1ull << t);
        tr->counters.waits_skipped++;
        break;
      }
    }
  }
  for (uint64_t m = kept; m != 0; m &= m - 1) {
    unsigned t = (unsigned)__builtin_ctzll(m);
    weft_status_t st = wait_on(tr, s, &tr->streams[t], need[t]);
    if (st != WEFT_OK) return st;
  }
  return WEFT_OK;
}

static weft_status_t begin_locked(weft__tracker_t *tr, weft_stream_t *s, const weft__use_t *uses, size_t n) {
  weft_status_t st = flush_pending(tr, s);
  if (st != WEFT_OK) return st;
  uint64_t need[WEFT__MAX_STREAMS];
  memset(need, 0, tr->n * sizeof need[0]);
  uint64_t mask = collect_needs(tr, s->index, uses, n, need);
  return issue_waits(tr, s, mask, need);
}

static weft_status_t end_locked(weft__tracker_t *tr, weft_stream_t *s, const weft__use_t *uses, size_t n) {
  weft_status_t st = flush_pending(tr, s);
  if (st != WEFT_OK) return st;
  uint64_t k = s->tick + 1;
  unsigned slot = (unsigned)(k & (tr->ring_size - 1));
  CUresult r = tr->drv->cuEventRecord(s->ring[slot], s->raw);
  if (r != CUDA_SUCCESS) return weft__driver_fail(r, "cuEventRecord");
  s->tick = k;
  s->recorded = k;
  s->dirty = false;
  uint64_t *row = ROW(tr, s->index);
  row[s->index] = k;
  memcpy(&s->ring_clock[(size_t)slot * tr->n], row, tr->n * sizeof(uint64_t));
  s->ring_tick[slot] = k;
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

weft_status_t weft__tracker_begin(weft_stream_t *s, const weft__use_t *uses, size_t n) {
  weft__tracker_t *tr = s->tr;
  lock(tr);
  weft_status_t st = begin_locked(tr, s, uses, n);
  unlock(tr);
  return st;
}

weft_status_t weft__tracker_end(weft_stream_t *s, const weft__use_t *uses, size_t n) {
  weft__tracker_t *tr = s->tr;
  lock(tr);
  weft_status_t st = end_locked(tr, s, uses, n);
  unlock(tr);
  return st;
}

weft_status_t weft__tracker_use(weft_stream_t *s, const weft__use_t *uses, size_t n,
                                weft_status_t (*fn)(weft_stream_t *s, void *arg), void *arg) {
  weft__tracker_t *tr = s->tr;
  lock(tr);
  weft_status_t st = begin_locked(tr, s, uses, n);
  if (st == WEFT_OK) st = fn(s, arg);
  if (st == WEFT_OK) st = end_locked(tr, s, uses, n);
  unlock(tr);
  return st;
}

weft__point_t weft__tracker_point(weft_stream_t *s) {
  weft__tracker_t *tr = s->tr;
  lock(tr);
  if (s->dirty) {
    s->tick++;
    ROW(tr, s->index)[s->index] = s->tick;
    s->dirty = false; /* the event is recorded at the next flush_pending */
  }
  weft__point_t p = {s->index, s->tick};
  unlock(tr);
  return p;
}

bool weft__tracker_is_ordered(weft_stream_t *s, weft__point_t p) {
  weft__tracker_t *tr = s->tr;
  lock(tr);
  bool ok = p.stream >= tr->n || implied(tr, s->index, p.stream, p.tick);
  unlock(tr);
  return ok;
}

weft_status_t weft__tracker_order(weft_stream_t *s, weft__point_t p) {
  weft__tracker_t *tr = s->tr;
  weft_status_t st = WEFT_OK;
  lock(tr);
  if (p.stream < tr->n && !implied(tr, s->index, p.stream, p.tick)) {
    st = flush_pending(tr, s);
    if (st == WEFT_OK) st = wait_on(tr, s, &tr->streams[p.stream], p.tick);
  }
  unlock(tr);
  return st;
}

/* The host saw (t, slot's tick) complete: so is everything in that event's clock. */
static void learn_complete(weft__tracker_t *tr, unsigned t, const uint64_t *snap, uint64_t tick) {
  for (unsigned u = 0; u < tr->n; u++) tr->host_known[u] = max_u64(tr->host_known[u], snap[u]);
  tr->host_known[t] = max_u64(tr->host_known[t], tick);
}

bool weft__tracker_poll(weft__tracker_t *tr, weft__point_t p) {
  if (p.tick == 0) return true;
  bool done = false;
  lock(tr);
  if (tr->host_known[p.stream] >= p.tick) {
    done = true;
  } else {
    weft_stream_t *t = &tr->streams[p.stream];
    unsigned slot;
    if (slot_for(tr, t, p.tick, &slot) == WEFT_OK && tr->drv->cuEventQuery(t->ring[slot]) == CUDA_SUCCESS) {
      learn_complete(tr, p.stream, &t->ring_clock[(size_t)slot * tr->n], t->ring_tick[slot]);
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

/* Blocks on the point's event without the lock, then records the host's knowledge. */
weft_status_t weft__tracker_sync_points(weft__tracker_t *tr, const weft__point_t *pts, size_t n) {
  for (size_t i = 0; i < n; i++) {
    weft__point_t p = pts[i];
    if (p.tick == 0 || p.stream >= tr->n) continue;
    uint64_t snap[WEFT__MAX_STREAMS];
    lock(tr);
    if (tr->host_known[p.stream] >= p.tick) {
      unlock(tr);
      continue;
    }
    weft_stream_t *t = &tr->streams[p.stream];
    unsigned slot;
    weft_status_t st = slot_for(tr, t, p.tick, &slot);
    if (st != WEFT_OK) {
      unlock(tr);
      return st;
    }
    /* Copy the clock now: the slot may be re-recorded once the lock is dropped; the event we
     * then wait for is newer and covers this snapshot. */
    memcpy(snap, &t->ring_clock[(size_t)slot * tr->n], tr->n * sizeof(uint64_t));
    uint64_t tick = t->ring_tick[slot];
    CUevent ev = t->ring[slot];
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
  uint64_t snap[WEFT__MAX_STREAMS];
  lock(tr);
  memcpy(snap, ROW(tr, s->index), tr->n * sizeof(uint64_t));
  uint64_t tick = s->tick;
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
    memset(need, 0, tr->n * sizeof need[0]);
    unsigned waits = (unsigned)__builtin_popcountll(collect_needs(tr, c, uses, n, need));
    weft_stream_t *s = &tr->streams[c];
    if (waits < best_waits || (waits == best_waits && s->last_used < best->last_used)) {
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
  s->dirty = true;
  unlock(s->tr);
}

weft_status_t weft__tracker_import_event(weft_stream_t *s, CUevent ev) {
  weft__tracker_t *tr = s->tr;
  lock(tr);
  weft_status_t st = flush_pending(tr, s);
  if (st == WEFT_OK) {
    CUresult r = tr->drv->cuStreamWaitEvent(s->raw, ev, 0);
    if (r != CUDA_SUCCESS) st = weft__driver_fail(r, "cuStreamWaitEvent");
    else s->dirty = true;
  }
  unlock(tr);
  return st;
}

bool weft__tracker_is_valid(weft__tracker_t *tr) {
  bool ok = true;
  lock(tr);
  for (unsigned s = 0; s < tr->n && ok; s++) {
    weft_stream_t *st = &tr->streams[s];
    const uint64_t *row = ROW(tr, s);
    if (row[s] != st->tick) ok = weft__debug_report("tracker", "known[s][s] != tick[s]");
    if (st->recorded > st->tick) ok = weft__debug_report("tracker", "recorded tick beyond tick");
    if (st->tick - st->recorded > 1) ok = weft__debug_report("tracker", "more than one pending tick");
    for (unsigned t = 0; t < tr->n && ok; t++) {
      if (row[t] > tr->streams[t].tick) ok = weft__debug_report("tracker", "known beyond the other stream's tick");
      if (tr->host_known[t] > tr->streams[t].tick) ok = weft__debug_report("tracker", "host knows a future tick");
    }
    for (unsigned slot = 0; slot < tr->ring_size && ok; slot++) {
      if (st->ring_tick[slot] == 0) continue;
      if (st->ring_tick[slot] > st->recorded) ok = weft__debug_report("tracker", "ring slot newer than recorded");
      const uint64_t *snap = &st->ring_clock[(size_t)slot * tr->n];
      for (unsigned t = 0; t < tr->n && ok; t++)
        if (snap[t] > row[t]) ok = weft__debug_report("tracker", "ring snapshot ahead of the stream's row");
    }
  }
  unlock(tr);
  return ok;
}
