/* Clock domains (private to streams/): the two operations every tracker and capture function is
 * built from, and the helpers around them. Every function here runs under the tracker lock
 * (or on a domain nobody else can reach yet).
 *
 *   record: s's newest work gets a tick (a new one, or the pending one it joins) and the event
 *           of that tick is recorded with s's clock as its snapshot;
 *   wait:   s waits on the event of a tick of t (or the newer event standing in for an evicted
 *           one) and merges that event's snapshot into its row.
 */
#ifndef WEFT_STREAMS_CLOCK_H
#define WEFT_STREAMS_CLOCK_H

#include "streams/tracker.h"

#define WEFT__ROW(d, s) (&(d)->known[(size_t)(s) * (d)->stride])

/** The lane of s in domain d: its global lane in the live domain, its pool index in a capture's. */
static inline unsigned weft__at(const weft__domain_t *d, const weft_stream_t *s) {
  return d->capture != NULL ? s->index : s->lane;
}

static inline uint64_t weft__max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }

/** Work enqueued on s from now on is ordered after (t, k), or the host saw it complete. */
static inline bool weft__clock_implied(const weft__domain_t *d, unsigned s, unsigned t, uint64_t k) {
  return k == 0 || s == t || WEFT__ROW(d, s)[t] >= k || d->host_known[t] >= k;
}

/** The domain a use on s belongs to: its capture's, or the live one. */
static inline weft__domain_t *weft__clock_domain(weft__tracker_t *tr, const weft_stream_t *s) {
  weft__capture_t *c = atomic_load_explicit(&((weft_stream_t *)s)->capture, memory_order_relaxed);
  return c != NULL ? &c->dom : tr->live;
}

/* ---- the process's live domain ---------------------------------------------------------------- */

/** The lock of every tracker (rank 30): the live domain is shared. */
extern weft__lock_t weft__clock_lock;
/** Waits (the lock held, released meanwhile) for weft__clock_idle unless no lane of `lanes` is
 * busy any more: a fast use clears its lane without the lock, so the lanes are asked again after
 * this thread counts itself a waiter (weft__cond_wait_unless). The caller loops. */
void weft__clock_idle_wait(weft__tracker_t *tr, weft__lanes_t lanes);
/** Wakes the threads waiting for weft__clock_idle (tracker.h), if any (lock held). */
static inline void weft__clock_idle_signal(void) { weft__cond_broadcast(&weft__clock_idle); }
/** Gives tr n consecutive lanes of the live domain (creating the domain on first use): tr->live,
 * tr->base. Lock held. BUSY when the process has no n consecutive lanes free (WEFT__MAX_LANES
 * over all runtimes), HOST_OUT_OF_MEMORY. */
weft_status_t weft__clock_lanes_take(weft__tracker_t *tr, unsigned n);
/** Lane `at` of d starts again as a new stream's (lock held): ordered after nothing, every tick so
 * far complete (the host knows it: the caller made sure), nothing pending; its tick counter and
 * its ring's events go on. Lanes taken (weft__clock_lanes_take) and per-thread slots taken back
 * (weft__tracker_reclaim) start so. */
void weft__clock_renew(weft__domain_t *d, unsigned at);
/** Gives tr's lanes back (lock held): their work is complete (the host knows every tick), their
 * events were freed; their tick counters go on with the next owner. */
void weft__clock_lanes_give(weft__tracker_t *tr);

/** Allocates a capture's domain for the n streams of its runtime (rings are created lazily). */
weft_status_t weft__domain_init(weft__domain_t *d, unsigned n, unsigned ring_size, weft__capture_t *capture);
/** Frees a capture's domain: its clocks, and its lanes' events to the tracker's spares (never
 * fails; takes the tracker lock). The live domain is never freed: its lanes go back with
 * weft__clock_lanes_give. */
weft_status_t weft__domain_free(weft__tracker_t *tr, weft__domain_t *d);
/** Gives a lane's events back: a capture's to the tracker's spares (the caller holds the
 * tracker lock; room was reserved when they were made), a live lane's to the driver (the first
 * failure is returned; everything is freed regardless). */
weft_status_t weft__lane_free(weft__tracker_t *tr, weft__domain_t *d, weft__lane_t *l);
/** Creates a lane's events and ring if it has none yet (a capture's lane: with the tracker lock
 * held, from the spares first). */
weft_status_t weft__lane_init(weft__tracker_t *tr, weft__domain_t *d, weft__lane_t *l);

/** Records the event of s's pending tick, if any, so that it sits at its point: called before
 * weft enqueues anything else on s, and by whoever must wait for that tick. */
weft_status_t weft__clock_flush(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *s);
/** Gives the work enqueued on s since its last tick a tick (joining a pending one) and records
 * its event. The tick stays assigned (pending) when the record fails; *tick receives it.
 * Joining is sound because nothing can know a pending tick complete: waits record it first,
 * and the host learns only recorded ticks. */
weft_status_t weft__clock_record(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *s, uint64_t *tick);
/** What the ring slot of recorded tick k of lane l kept of its uses (weft__lane_t.ring_use); 0
 * when the slot was reused since (or the lane has no ring). */
static inline uint64_t weft__clock_ring_use(const weft__lane_t *l, uint64_t k) {
  unsigned slot = (unsigned)(k & (l->ring_size - 1));
  return l->ring_tick != NULL && l->ring_tick[slot] == k ? l->ring_use[slot] : 0;
}
/** What the host waits on for all the recorded work of lane `at`: true with *ev NULL where the
 * host knows it complete (tick 0 included), true with the event of its newest recorded tick, or
 * false where no event covers that tick any more (lock held). */
static inline bool weft__clock_newest_event(const weft__domain_t *d, unsigned at, CUevent *ev) {
  const weft__lane_t *l = &d->lane[at];
  uint64_t k = l->recorded;
  unsigned slot = (unsigned)(k & (l->ring_size - 1));
  *ev = NULL;
  if (d->host_known[at] >= k) return true;
  if (l->ring == NULL || l->ring_tick[slot] != k) return false;
  *ev = l->ring[slot];
  return true;
}
/** The newest deferred use (weft__domain_t.use_seq numbers those only) that tick k of lane t
 * covers: the lane's newest while k is pending, the one its ring slot kept once recorded; 0 when
 * the slot was reused. */
static inline uint64_t weft__clock_newest_use(const weft__domain_t *d, unsigned t, uint64_t k) {
  const weft__lane_t *l = &d->lane[t];
  return k > l->recorded ? l->last_use : weft__clock_ring_use(l, k) >> 1;
}

/** Waits in a row for an eager lane's newest tick that turn it lazy again (weft__clock_needed). */
#define WEFT__CLOCK_CALM 16

/** Another stream is about to wait for tick k of t (call it for a wait that is issued, before
 * weft__clock_wait; k pending or already recorded). With lazy records a tick may cover several
 * uses (later ones joined it); unless the waiter needs the newest of them (`newest`:
 * weft__clock_newest_use), its wait is late, for more than it needs: it is counted and t's lane
 * turns eager, so that from then on each use records its own event. An eager lane (not an exact
 * one) whose waiters needed its newest tick WEFT__CLOCK_CALM times in a row, with no need of an
 * older tick between, turns lazy again: those waiters would have been served exactly by a
 * deferred tick, so the records after each use bought nothing. */
void weft__clock_needed(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *t, uint64_t k, bool newest);
/** Publishes lane `at`'s point for lock-free readers (weft_stream_t.point of s, the lane's
 * stream in the live domain; weft__clock_published is the value): 1 + its tick while it is not
 * dirty, else 0; always 0 for a
 * per-thread stream, whose point is taken under the lock (point_locked records it at once: only
 * its owner can). Called wherever a live lane's tick or dirtiness changes, and when a stream is
 * adopted; lock held. */
static inline uint64_t weft__clock_published(const weft__domain_t *d, unsigned at, const weft_stream_t *s) {
  const weft__lane_t *l = &d->lane[at];
  return l->dirty || s->per_thread ? 0 : l->tick + 1;
}
static inline void weft__clock_publish_stream(const weft__domain_t *d, unsigned at, weft_stream_t *s) {
  atomic_store_explicit(&s->point, weft__clock_published(d, at, s), memory_order_release);
}
/** weft__clock_publish_stream for lane `at` of d, whose stream d knows (nothing for a capture's
 * domain, or a lane without a stream). */
static inline void weft__clock_publish(const weft__domain_t *d, unsigned at) {
  weft_stream_t *s = d->capture == NULL ? d->stream[at] : NULL;
  if (s != NULL) weft__clock_publish_stream(d, at, s);
}
/** Lane `at`'s tick for the work enqueued next, its point left as it was (the caller publishes
 * or withdraws it): the pending tick, a new one when it has none (its event, recorded later,
 * lands after the work enqueued meanwhile too), or with `defer` (lazy records, tracker.h) the
 * deferred tick it joins. The lane's work is then covered by it (not dirty). Inline, as the ones
 * below: every use takes a tick. A busy use (tracker.h, "Busy lanes") takes its tick so, before
 * its work is enqueued, and withdraws the lane's point: a failure takes the tick back. */
static inline uint64_t weft__clock_take(weft__domain_t *d, unsigned at, bool defer) {
  weft__lane_t *l = &d->lane[at];
  if (l->tick == l->recorded) {
    l->tick++;
    WEFT__ROW(d, at)[at] = l->tick;
  } else if (defer && l->deferred) {
    l->joined++; /* joins the deferred tick */
  }
  l->dirty = false;
  if (defer) l->deferred = true;
  return l->tick;
}
/** Lane `at`'s pending tick (weft__clock_take), published. */
static inline uint64_t weft__clock_pending_tick(weft__domain_t *d, unsigned at) {
  uint64_t k = weft__clock_take(d, at, false);
  weft__clock_publish(d, at);
  return k;
}
/** Gives the work of the use just enqueued on s a tick without recording its event (lazy
 * records, tracker.h): a new pending tick, or the deferred one it joins; published. */
static inline uint64_t weft__clock_defer(weft__domain_t *d, weft_stream_t *s) {
  unsigned at = weft__at(d, s);
  uint64_t k = weft__clock_take(d, at, true);
  weft__clock_publish(d, at);
  return k;
}
/** A tick covering everything enqueued on s so far, recorded lazily (see tracker.h). */
static inline uint64_t weft__clock_point(weft__domain_t *d, const weft_stream_t *s) {
  unsigned at = weft__at(d, s);
  /* New work or waits since the newest tick: the pending tick covers them. */
  return d->lane[at].dirty ? weft__clock_pending_tick(d, at) : d->lane[at].tick;
}
/** The ring slot of the oldest recorded tick >= k of stream t (k <= tick), flushing t's pending
 * tick first, unless t's lane is busy (tracker.h: then k is an older, recorded tick, and the
 * pending one is the busy use's). With k evicted, a newer event stands in: waiting on it is later than needed but
 * never wrong. An exposed live stream's pending tick is not recorded while code outside weft
 * captures it (the driver is asked before and after the record: a capture begun meanwhile may
 * hold the event, which is then given up): then k's event serves if it exists, else CAPTURE.
 * A lookup counts nothing: the waits served by a stand-in are counted where they are made
 * (weft__clock_wait, weft__tracker_sync_points: counters.ring_evictions). */
weft_status_t weft__clock_slot(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *t, uint64_t k, unsigned *slot);
/** Records t's pending tick as weft__clock_slot does (on an exposed live stream the driver is
 * asked before and after the record); WEFT_ERR_CAPTURE, with no message, where code outside weft
 * captures t (nothing recorded). Lock held; tr's context current. */
weft_status_t weft__clock_settle(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *t);
/** For a host wait on t: a new pending tick covering everything enqueued on t by now (work
 * outside weft too), recorded, in *tick, with weft__clock_slot's checks on an exposed live
 * stream (CAPTURE while code outside weft captures t, or began to as it was recorded; *tick is
 * then the newest recorded one). Lock held. */
weft_status_t weft__clock_record_for_host(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *t, uint64_t *tick);
/** Makes s's lane exact (weft__lane_t.exact; live domain only, else nothing): its pending tick
 * recorded first (not an exposed stream's, nor while s captures: it would land in the capture), then eager, and its ring keeps every event the host
 * does not know complete. Lock held; s's lane not busy. */
weft_status_t weft__clock_exact(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *s);
/** Makes s wait for tick k of t and merges the event's clock into s's row. A wait for an exact
 * lane makes s exact first. A wait on a stand-in for an evicted k counts one ring eviction. */
weft_status_t weft__clock_wait(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *s, weft_stream_t *t, uint64_t k);
/** weft__clock_wait with k's slot already looked up (weft__clock_slot, in the same lock hold). */
weft_status_t weft__clock_wait_at(weft__tracker_t *tr, weft__domain_t *d, weft_stream_t *s, weft_stream_t *t,
                                  uint64_t k, unsigned slot);



/* ---- capture-local histories (capture.c), used by the tracker's uses ----------------------------- */

/** The capture-local record of a block, created on first touch (`internal`: allocated inside
 * the capture). NULL when out of host memory (nothing changed). */
weft__capture_block_t *weft__capture_block(weft__capture_t *c, weft__access_state_t *live, bool internal);
/** The capture-local record of a block, or NULL when the capture has not touched it. */
weft__capture_block_t *weft__capture_find(const weft__capture_t *c, const weft__access_state_t *live);

#endif /* WEFT_STREAMS_CLOCK_H */
