/* Pool streams: the public stream calls, and keeping a stream's capture state true to the
 * driver's: captures that code outside weft begins on a pool stream are adopted (weft's work on
 * the stream is then recorded into them, allocations go to graph memory) and dropped once their
 * owner ends them. */
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "lib/core/debug.h"
#include "lib/core/error.h"
#include "lib/core/meta.h"
#include "lib/runtime/runtime.h"

weft_status_t weft__stream_refuse(const weft_stream_t *s, const char *fn) {
  if (s == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "%s: stream is NULL", fn);
  weft_runtime_t *rt = s->runtime;
  if (weft__runtime_check(rt, fn) == NULL)
    return weft__error(weft__runtime_check_status(rt), "%s: %s", fn,
                       weft__runtime_check_status(rt) == WEFT_ERR_STALE_HANDLE ? "the stream's runtime was released"
                                                                               : "not a weft stream");
  if (s->tr != &rt->tracker || !weft__tracker_lane_used(&rt->tracker, s->index) || &rt->tracker.streams[s->index] != s)
    return weft__error(WEFT_ERR_STALE_HANDLE, "%s: the stream belongs to a released runtime", fn);
  if (!weft__tracker_owns(s))
    return weft__error(WEFT_ERR_INVALID_ARGUMENT,
                       "%s: stream %u is another thread's per-thread default stream (adopt CU_STREAM_PER_THREAD on "
                       "each thread that uses it)", fn, s->index);
  return WEFT_OK;
}

/* weft__stream_quiet's work, inline in weft__stream_ready. */
static inline bool quiet(weft_stream_t *s, weft_status_t *st) {
  *st = WEFT_OK;
  if (!atomic_load_explicit(&s->exposed, memory_order_relaxed)) return true;
  /* sync_capture's question, with what it returns on a failed answer. */
  if ((s->raw == NULL || s->raw == CU_STREAM_LEGACY) && (*st = weft__tracker_bind(s->tr)) != WEFT_OK) return true;
  bool active = false;
  uint64_t id;
  *st = weft__capture_probe(s, &active, &id);
  return *st != WEFT_OK || !active;
}

bool weft__stream_quiet(weft_stream_t *s, weft_status_t *st) { return quiet(s, st); }

bool weft__stream_ready(weft_stream_t *s, weft_status_t *st) {
  return weft__stream_plain(s) && !s->tr->no_fast_path &&
         atomic_load_explicit(&((weft_runtime_t *)s->runtime)->n_deferred, memory_order_acquire) == 0 &&
         quiet(s, st);
}

/* ---- foreign captures -------------------------------------------------------------------------- */

void weft__runtime_forget_capture_blocks(weft__capture_t *c) {
  for (size_t i = 0; i < c->blocks.len; i++) {
    const weft__capture_block_t *b = &WEFT__VEC_AT(&c->blocks, weft__capture_block_t, i);
    if (!b->internal || b->freed) continue;
    struct weft__block *rec = WEFT__BLOCK_OF(b->live);
    weft__resource_disown(rec->resource, rec->bytes);
    weft__block_forget(rec, b->gen); /* the generation it was allocated under (weft__tracker_new_block) */
  }
}

/* The stream whose capture handler this thread runs now (a handler may call weft on it). */
static _Thread_local weft_stream_t *tls_handling;

/* Waits until the capture handler for foreign capture `id` has returned on s (another thread
 * adopted the capture and runs it): a call that went on meanwhile, a weft_alloc inside the
 * capture, would allocate before the handler chose where (graph memory nodes, which nobody
 * frees: tests/graph test_capture_handler_race). */
static void wait_handled(weft_stream_t *s, uint64_t id) {
  if (tls_handling == s || atomic_load_explicit(&s->handled, memory_order_acquire) >= id) return;
  WEFT__TEST_POINT("sync_capture: waiting for the capture handler", s);
  for (uint64_t k; atomic_load_explicit(&s->handled, memory_order_acquire) < id; sched_yield())
    if (!weft__capture_foreign_of(s, &k) || k != id) return; /* dropped meanwhile: nothing to wait for */
}

/* Notes that the handler for capture `id` has returned on s. Capture ids grow (the driver's
 * capture sequence), so the mark only grows: a handler that returns late, after its capture
 * ended and a newer one was met and handled, must not take the newer one's mark back (the
 * newer one's waiters would wait for good: the helper's eight-thread test_outside_long). */
static void set_handled(weft_stream_t *s, uint64_t id) {
  uint64_t h = atomic_load_explicit(&s->handled, memory_order_relaxed);
  while (h < id && !atomic_compare_exchange_weak_explicit(&s->handled, &h, id, memory_order_release, memory_order_relaxed)) {
  }
}

/* Drops foreign capture `id` from s (weft__capture_drop_foreign; another thread may have dropped it
 * first) and frees it: blocks weft allocated inside it belong to the owner's graph, and its on_drop
 * runs (a graph pool it drew from is free again). Counted in s->dropping from before the unlink
 * until after on_drop, so that a call on another thread that finds no capture on s waits for the
 * drop to finish (wait_dropped): once the owner's call says the capture ended, everything it held
 * is given back (before, the owner's weft_graph_pool_destroy could say BUSY: the helper's
 * test_outside_long; tests/graph test_capture_windows holds the window). */
static void drop_foreign(weft_stream_t *s, uint64_t id) {
  atomic_fetch_add_explicit(&s->dropping, 1, memory_order_acq_rel);
  weft__capture_t *c = weft__capture_drop_foreign(s, id);
  if (c != NULL) {
    WEFT__TEST_POINT("sync_capture: dropping", s);
    if (c->on_drop != NULL) c->on_drop(c);
    weft__runtime_forget_capture_blocks(c);
    weft__capture_free(c);
  }
  atomic_fetch_sub_explicit(&s->dropping, 1, memory_order_release);
}

/* Waits until no other thread is dropping a capture of s (drop_foreign). */
static void wait_dropped(weft_stream_t *s) {
  while (atomic_load_explicit(&s->dropping, memory_order_acquire) != 0) sched_yield();
}

/* Adopts a capture code outside weft began on s, or drops one its owner ended (blocks weft
 * allocated inside then belong to the owner's graph). Only code that had the raw stream can have
 * begun a capture on it or forked it into one: other streams cost nothing here. The thread that
 * adopts it runs the capture handler; others meeting the capture meanwhile wait for it. */
static weft_status_t sync_capture(weft_stream_t *s) {
  if (weft__stream_unseen(s)) return WEFT_OK; /* the common case, without the tracker lock */
  /* Another thread's per-thread stream: CU_STREAM_PER_THREAD would name this thread's, so only
   * its owner asks the driver about it and meets or drops its captures; once the owner has ended,
   * a capture weft knows there is dropped by whoever looks. */
  if (!weft__tracker_owns(s)) {
    uint64_t known = 0;
    if (weft__capture_foreign_of(s, &known) && weft__tracker_owner_ended(s)) drop_foreign(s, known);
    wait_dropped(s);
    return WEFT_OK;
  }
  uint64_t known = 0;
  bool foreign = weft__capture_foreign_of(s, &known);
  if (!foreign && !atomic_load_explicit(&s->exposed, memory_order_relaxed)) return WEFT_OK;
  bool active;
  uint64_t id;
  weft_status_t st = weft__capture_probe(s, &active, &id);
  if (st != WEFT_OK) return st;
  if (foreign && (!active || id != known)) drop_foreign(s, known);
  wait_dropped(s);
  if (!active) return WEFT_OK;
  if (weft__tracker_capture_of(s, NULL) != NULL) { /* known: weft's own, or a foreign one adopted */
    if (weft__capture_foreign_of(s, &known) && known == id) wait_handled(s, id);
    return WEFT_OK;
  }
  weft__capture_t *nc;
  weft_runtime_t *rt = s->runtime;
  WEFT__TEST_POINT("sync_capture: probed", s);
  /* A foreign capture's mode is not visible; treat it as GLOBAL, the strictest. The driver is
   * asked again in the lock hold that adopts it: this look may be stale by now. */
  bool ended;
  st = weft__capture_begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL, true, id, rt->graph_nodes, &nc, &ended);
  WEFT__TEST_POINT("sync_capture: adopting", s);
  /* Another thread adopted it first: its handler may still run. */
  if (st == WEFT_ERR_CAPTURE && weft__tracker_capture_of(s, NULL) != NULL) {
    if (weft__capture_foreign_of(s, &known) && known == id) wait_handled(s, id);
    return WEFT_OK;
  }
  if (st != WEFT_OK) return st;
  if (ended) return sync_capture(s); /* a newer capture its owner began meanwhile is met as any */
  /* Its owner may have ended it between the probe and the adoption (and its next call, meeting
   * no capture in weft, dropped nothing): asked again, an ended one is dropped here, with no
   * handler run for it. A later end is met by the next call on s, as always. Before, the handler
   * ran for an ended capture (the PyTorch adapter made it a pool nobody destroyed). */
  bool still;
  uint64_t now;
  if ((st = weft__capture_probe(s, &still, &now)) != WEFT_OK || !still || now != id) {
    drop_foreign(s, id);
    set_handled(s, id); /* nobody waits for a handler */
    /* A newer capture its owner began meanwhile is met as any. */
    return st == WEFT_OK && still ? sync_capture(s) : st;
  }
  WEFT__TEST_POINT("sync_capture: adopted", s);
  /* Its owner may say where weft_alloc inside it allocates (weft_set_capture_handler); also on a
   * stream it was forked onto (nc NULL: s joined the capture another stream began), before
   * anything is allocated on s, whichever thread's handler runs first. */
  pthread_mutex_lock(&rt->blocks_lock);
  weft_capture_handler_t fn = rt->capture_handler;
  void *user = rt->capture_user;
  pthread_mutex_unlock(&rt->blocks_lock);
  if (fn != NULL) {
    weft_stream_t *was = tls_handling;
    tls_handling = s;
    st = fn(s, id, user);
    tls_handling = was;
  }
  /* Handled, also when it failed: the others go on (the capture's allocations then use graph
   * memory nodes, as weft.h says, unless the owner chooses a pool later). */
  set_handled(s, id);
  if (fn == NULL || st == WEFT_OK) return WEFT_OK;
  char why[256];
  snprintf(why, sizeof why, "%s", weft_last_error());
  return weft__error(st, "the capture handler failed for capture %llu on stream %u: %s", (unsigned long long)id,
                     s->index, why);
}

weft_status_t weft_set_capture_handler(weft_runtime_t *rt, weft_capture_handler_t fn, void *user) {
  if (weft__runtime_check(rt, "weft_set_capture_handler") == NULL) return weft__runtime_check_status(rt);
  pthread_mutex_lock(&rt->blocks_lock);
  rt->capture_handler = fn;
  rt->capture_user = fn != NULL ? user : NULL;
  pthread_mutex_unlock(&rt->blocks_lock);
  return WEFT_OK;
}

weft_status_t weft__stream_prepare(weft_stream_t *s) {
  weft_status_t st = weft__tracker_bind(s->tr);
  return st == WEFT_OK ? sync_capture(s) : st;
}

weft_status_t weft__stream_sync_capture_slow(weft_stream_t *s) { return sync_capture(s); }

void weft__runtime_refresh_captures(weft_runtime_t *rt) {
  /* Every exposed stream: a capture begun outside weft is unknown until asked about. */
  weft__tracker_t *tr = &rt->tracker;
  for (unsigned i = 0; i < tr->n && weft__tracker_lane_used(tr, i); i++) (void)sync_capture(&tr->streams[i]);
}

/* ---- the public stream calls ------------------------------------------------------------------ */

weft_status_t weft_stream_get(weft_runtime_t *rt, unsigned index, weft_stream_t **out) {
  if (weft__runtime_check(rt, "weft_stream_get") == NULL) return weft__runtime_check_status(rt);
  if (out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_stream_get: out is NULL");
  if (index >= rt->tracker.n_pool)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_stream_get: index %u >= stream_count %u", index, rt->tracker.n_pool);
  *out = &rt->tracker.streams[index];
  return WEFT_OK;
}

weft_status_t weft_stream_adopt(weft_runtime_t *rt, CUstream raw, weft_stream_t **out) {
  weft_status_t st;
  weft__tracker_t *tr = weft__runtime_tracker(rt, "weft_stream_adopt", &st);
  if (tr == NULL) return st;
  if (out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_stream_adopt: out is NULL");
  if ((st = weft__tracker_bind(tr)) != WEFT_OK) return st;
  st = weft__tracker_adopt(tr, raw, out);
  if (st != WEFT_ERR_BUSY || raw != CU_STREAM_PER_THREAD) return st;
  /* Every slot is taken: the per-thread stream of a thread that has ended is taken back, its
   * captures dropped first (sync_capture). Its cached blocks stay with the slot: their last use
   * is complete once it is taken back. */
  weft__runtime_refresh_captures(rt);
  st = weft__tracker_reclaim(tr, out);
  return st == WEFT_ERR_BUSY ? weft__tracker_adopt(tr, raw, out) : st; /* BUSY says why */
}

weft_status_t weft_stream_next(weft_runtime_t *rt, weft_priority_t prio, weft_stream_t **out) {
  if (weft__runtime_check(rt, "weft_stream_next") == NULL) return weft__runtime_check_status(rt);
  if (out == NULL || (prio != WEFT_PRIORITY_NORMAL && prio != WEFT_PRIORITY_HIGH))
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_stream_next: bad priority or NULL out");
  weft__tracker_t *tr = &rt->tracker;
  unsigned count = prio == WEFT_PRIORITY_HIGH ? tr->n_high : tr->n_pool - tr->n_high;
  if (count == 0)
    return weft__error(WEFT_ERR_NOT_SUPPORTED, "weft_stream_next: the pool has no %s-priority stream",
                       prio == WEFT_PRIORITY_HIGH ? "high" : "normal");
  unsigned first = prio == WEFT_PRIORITY_HIGH ? tr->n_pool - tr->n_high : 0;
  weft__lock(tr->lock);
  unsigned i = tr->rr[prio]++ % count;
  weft__unlock(tr->lock);
  *out = &tr->streams[first + i];
  return WEFT_OK;
}

weft_status_t weft_stream_auto(weft_runtime_t *rt, weft_priority_t prio, const weft_access_t *accesses, size_t n,
                               weft_stream_t **out) {
  if (weft__runtime_check(rt, "weft_stream_auto") == NULL) return weft__runtime_check_status(rt);
  if (out == NULL || (prio != WEFT_PRIORITY_NORMAL && prio != WEFT_PRIORITY_HIGH))
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_stream_auto: bad priority or NULL out");
  weft__tracker_t *tr = &rt->tracker;
  if ((prio == WEFT_PRIORITY_HIGH ? tr->n_high : tr->n_pool - tr->n_high) == 0)
    return weft__error(WEFT_ERR_NOT_SUPPORTED, "weft_stream_auto: the pool has no stream of that priority");
  weft__use_t small[16];
  weft__use_t *uses = weft__small_alloc(small, 16, n, sizeof *uses);
  if (uses == NULL) return weft__error(WEFT_ERR_HOST_OUT_OF_MEMORY, "weft_stream_auto: no host memory");
  weft_status_t st = weft__uses_from_accesses(&tr->streams[0], accesses, n, uses, "weft_stream_auto");
  weft_stream_t *best = st == WEFT_OK ? weft__tracker_auto(tr, prio == WEFT_PRIORITY_HIGH, uses, n) : NULL;
  if (st == WEFT_OK && best == NULL)
    st = weft__error(WEFT_ERR_CAPTURE, "weft_stream_auto: every stream of that priority takes part in a capture");
  if (st == WEFT_OK) *out = best;
  weft__small_free(small, uses);
  return st;
}

CUstream weft_stream_raw(const weft_stream_t *s) {
  if (s == NULL) return NULL;
  /* A stream of a released runtime names no stream any more. */
  weft_runtime_t *rt = s->runtime;
  if (weft__runtime_check(rt, "weft_stream_raw") == NULL || s->tr != &rt->tracker ||
      !weft__tracker_lane_used(&rt->tracker, s->index))
    return NULL;
  /* From now on code outside weft may begin a capture on it: weft watches for that. */
  weft__tracker_expose((weft_stream_t *)s);
  return s->raw;
}
int weft_stream_index(const weft_stream_t *s) {
  return weft__stream_check(s, "weft_stream_index") == WEFT_OK ? (int)s->index : -1;
}
weft_runtime_t *weft_stream_runtime(const weft_stream_t *s) {
  return weft__stream_check(s, "weft_stream_runtime") == WEFT_OK ? s->runtime : NULL;
}

weft_status_t weft_stream_priority(const weft_stream_t *s, int *out) {
  weft_status_t st = weft__stream_check(s, "weft_stream_priority");
  if (st != WEFT_OK) return st;
  if (out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_stream_priority: out is NULL");
  WEFT__CU_TRY(s->tr->drv->cuStreamGetPriority(s->raw, out));
  return WEFT_OK;
}

weft_status_t weft_stream_id(const weft_stream_t *s, unsigned long long *out) {
  weft_status_t st = weft__stream_check(s, "weft_stream_id");
  if (st != WEFT_OK) return st;
  if (out == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_stream_id: out is NULL");
  if (s->tr->drv->cuStreamGetId == NULL)
    return weft__error(WEFT_ERR_NOT_SUPPORTED, "weft_stream_id: the driver has no cuStreamGetId");
  WEFT__CU_TRY(s->tr->drv->cuStreamGetId(s->raw, out));
  return WEFT_OK;
}

/* Host waits: ended foreign captures must stop holding them back first. */
static weft_status_t host_wait(weft_stream_t *s, bool blocking) {
  weft_status_t st = weft__stream_check(s, blocking ? "weft_stream_synchronize" : "weft_stream_query");
  if (st == WEFT_OK) st = weft__stream_prepare(s);
  if (st != WEFT_OK) return st;
  weft__runtime_refresh_captures(s->runtime);
  return blocking ? weft__tracker_sync_stream(s) : weft__tracker_query_stream(s);
}

weft_status_t weft_stream_synchronize(weft_stream_t *s) { return host_wait(s, true); }

weft_status_t weft_stream_is_capturing(weft_stream_t *s, int *out) {
  weft_status_t st = weft__stream_check(s, "weft_stream_is_capturing");
  if (st == WEFT_OK && out == NULL) st = weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_stream_is_capturing: out is NULL");
  if (st == WEFT_OK) st = weft__stream_prepare(s);
  WEFT__TEST_POINT("weft_stream_is_capturing: synced", s);
  if (st == WEFT_OK) *out = weft__tracker_capture_of(s, NULL) != NULL;
  return st;
}
weft_status_t weft_stream_query(weft_stream_t *s) { return host_wait(s, false); }
